# train.m4: zlib and OpenBLAS for tools/gcoll-train. zlib reads the gzipped IDX files as
# Debian's dataset-fashion-mnist ships them (without it gcoll-train reads only gunzipped
# files); OpenBLAS's cblas_sgemm is used when found (--with-openblas[=DIR|yes|no|auto]),
# else gcoll-train's own blocked sgemm. Sets TRAIN_CPPFLAGS and TRAIN_LIBS.
AC_DEFUN([GCOLL_CHECK_TRAIN], [
  AC_ARG_WITH([openblas],
    [AS_HELP_STRING([--with-openblas@<:@=DIR@:>@], [OpenBLAS sgemm for gcoll-train (yes|no|auto|DIR, default auto)])],
    [], [with_openblas=auto])
  gcoll_have_zlib=no
  PKG_CHECK_MODULES([ZLIB], [zlib], [gcoll_have_zlib=yes],
    [AC_CHECK_LIB([z], [gzopen], [ZLIB_CFLAGS=""; ZLIB_LIBS=-lz; gcoll_have_zlib=yes])])
  AS_IF([test "x$gcoll_have_zlib" = xyes],
    [save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $ZLIB_CFLAGS"
     AC_CHECK_HEADER([zlib.h], [], [gcoll_have_zlib=no])
     CPPFLAGS=$save_CPPFLAGS])
  AS_IF([test "x$gcoll_have_zlib" = xno],
    [AC_MSG_WARN([zlib not found (Debian: zlib1g-dev): gcoll-train will read only gunzipped IDX files])
     ZLIB_CFLAGS=""; ZLIB_LIBS=""])

  gcoll_have_openblas=no
  AS_IF([test "x$with_openblas" != xno], [
    AS_CASE(["$with_openblas"],
      [yes|auto], [PKG_CHECK_MODULES([OPENBLAS], [openblas], [gcoll_have_openblas=yes],
                     [AC_CHECK_LIB([openblas], [cblas_sgemm], [OPENBLAS_CFLAGS=""; OPENBLAS_LIBS=-lopenblas; gcoll_have_openblas=yes])])],
      [OPENBLAS_CFLAGS="-I$with_openblas/include"; OPENBLAS_LIBS="-L$with_openblas/lib -lopenblas"
       gcoll_have_openblas=yes])
    AS_IF([test "x$gcoll_have_openblas" = xyes],
      [save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $OPENBLAS_CFLAGS"
       AC_CHECK_HEADER([cblas.h], [], [gcoll_have_openblas=no])
       CPPFLAGS=$save_CPPFLAGS])
    AS_IF([test "x$gcoll_have_openblas" = xyes],
      [save_LIBS=$LIBS; LIBS="$OPENBLAS_LIBS $LIBS"
       AC_MSG_CHECKING([whether cblas_sgemm and openblas_set_num_threads link])
       AC_LINK_IFELSE([AC_LANG_PROGRAM([[void cblas_sgemm(); void openblas_set_num_threads(int);]],
                                       [[openblas_set_num_threads(1); cblas_sgemm();]])],
                      [AC_MSG_RESULT([yes])], [AC_MSG_RESULT([no]); gcoll_have_openblas=no])
       LIBS=$save_LIBS])
    AS_IF([test "x$gcoll_have_openblas" = xno && test "x$with_openblas" != xauto],
          [AC_MSG_ERROR([--with-openblas was given but OpenBLAS was not found (Debian: libopenblas-dev)])])
  ])
  AS_IF([test "x$gcoll_have_openblas" = xno], [OPENBLAS_CFLAGS=""; OPENBLAS_LIBS=""])

  TRAIN_CPPFLAGS=""
  TRAIN_LIBS=""
  AS_IF([test "x$gcoll_have_zlib" = xyes],
    [TRAIN_CPPFLAGS="-DGCOLL_TRAIN_HAVE_ZLIB $ZLIB_CFLAGS"; TRAIN_LIBS="$ZLIB_LIBS"])
  AS_IF([test "x$gcoll_have_openblas" = xyes],
    [TRAIN_CPPFLAGS="$TRAIN_CPPFLAGS -DGCOLL_TRAIN_HAVE_OPENBLAS $OPENBLAS_CFLAGS"
     TRAIN_LIBS="$TRAIN_LIBS $OPENBLAS_LIBS"])
  AC_SUBST([TRAIN_CPPFLAGS])
  AC_SUBST([TRAIN_LIBS])
  AM_CONDITIONAL([HAVE_TRAIN_ZLIB], [test "x$gcoll_have_zlib" = xyes])
  AM_CONDITIONAL([HAVE_OPENBLAS], [test "x$gcoll_have_openblas" = xyes])
])
