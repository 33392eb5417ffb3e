# hwloc.m4: --with-hwloc[=DIR|yes|no|auto]: topology for progress-thread placement.
AC_DEFUN([GCOLL_CHECK_HWLOC], [
  AC_ARG_WITH([hwloc],
    [AS_HELP_STRING([--with-hwloc@<:@=DIR@:>@], [use hwloc for thread placement (yes|no|auto|DIR, default auto)])],
    [], [with_hwloc=auto])
  gcoll_have_hwloc=no
  AS_IF([test "x$with_hwloc" != xno], [
    AS_CASE(["$with_hwloc"],
      [yes|auto], [PKG_CHECK_MODULES([HWLOC], [hwloc], [gcoll_have_hwloc=yes],
                     [AC_CHECK_LIB([hwloc], [hwloc_topology_init], [HWLOC_LIBS=-lhwloc; gcoll_have_hwloc=yes])])],
      [HWLOC_CFLAGS="-I$with_hwloc/include"; HWLOC_LIBS="-L$with_hwloc/lib -lhwloc"
       save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $HWLOC_CFLAGS"
       AC_CHECK_HEADER([hwloc.h], [gcoll_have_hwloc=yes])
       CPPFLAGS=$save_CPPFLAGS])
    AS_IF([test "x$gcoll_have_hwloc" = xno && test "x$with_hwloc" != xauto],
          [AC_MSG_ERROR([--with-hwloc was given but hwloc was not found (Debian: libhwloc-dev)])])
  ])
  AS_IF([test "x$gcoll_have_hwloc" = xyes],
        [AC_DEFINE([HAVE_HWLOC], [1], [hwloc topology])],
        [HWLOC_CFLAGS=""; HWLOC_LIBS=""])
  AC_SUBST([HWLOC_CFLAGS])
  AC_SUBST([HWLOC_LIBS])
  AM_CONDITIONAL([HAVE_HWLOC], [test "x$gcoll_have_hwloc" = xyes])
])
