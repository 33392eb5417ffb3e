# ucx.m4: --with-ucx[=DIR|yes|no|auto]: UCX's UCP layer for the ucx transport.
AC_DEFUN([GCOLL_CHECK_UCX], [
  AC_ARG_WITH([ucx],
    [AS_HELP_STRING([--with-ucx@<:@=DIR@:>@], [build the UCX transport (yes|no|auto|DIR, default auto)])],
    [], [with_ucx=auto])
  gcoll_have_ucx=no
  AS_IF([test "x$with_ucx" != xno], [
    AS_CASE(["$with_ucx"],
      [yes|auto], [PKG_CHECK_MODULES([UCX], [ucx], [gcoll_have_ucx=yes],
                     [AC_CHECK_LIB([ucp], [ucp_init_version], [UCX_LIBS="-lucp -lucs"; gcoll_have_ucx=yes])])],
      [UCX_CFLAGS="-I$with_ucx/include"; UCX_LIBS="-L$with_ucx/lib -lucp -lucs"
       save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $UCX_CFLAGS"
       AC_CHECK_HEADER([ucp/api/ucp.h], [gcoll_have_ucx=yes])
       CPPFLAGS=$save_CPPFLAGS])
    AS_IF([test "x$gcoll_have_ucx" = xno && test "x$with_ucx" != xauto],
          [AC_MSG_ERROR([--with-ucx was given but UCX was not found (Debian: libucx-dev)])])
  ])
  AS_IF([test "x$gcoll_have_ucx" = xyes],
        [AC_DEFINE([HAVE_UCX], [1], [UCX transport]) gcoll_ucx_summary=",ucx"],
        [UCX_CFLAGS=""; UCX_LIBS=""; gcoll_ucx_summary=""])
  AC_SUBST([UCX_CFLAGS])
  AC_SUBST([UCX_LIBS])
  AM_CONDITIONAL([HAVE_UCX], [test "x$gcoll_have_ucx" = xyes])
])
