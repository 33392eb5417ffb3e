# verbs.m4: --with-verbs[=DIR|yes|no|auto]: libibverbs headers for the verbs transport.
# The library itself is loaded with dlopen at run time, so only headers are needed here.
AC_DEFUN([GCOLL_CHECK_VERBS], [
  AC_ARG_WITH([verbs],
    [AS_HELP_STRING([--with-verbs@<:@=DIR@:>@], [build the InfiniBand verbs transport (yes|no|auto|DIR, default auto)])],
    [], [with_verbs=auto])
  gcoll_have_verbs=no
  VERBS_CFLAGS=""
  AS_IF([test "x$with_verbs" != xno], [
    AS_CASE(["$with_verbs"], [yes|auto], [], [VERBS_CFLAGS="-I$with_verbs/include"])
    save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $VERBS_CFLAGS"
    AC_CHECK_HEADER([infiniband/verbs.h], [gcoll_have_verbs=yes])
    CPPFLAGS=$save_CPPFLAGS
    AS_IF([test "x$gcoll_have_verbs" = xno && test "x$with_verbs" != xauto],
          [AC_MSG_ERROR([--with-verbs was given but infiniband/verbs.h was not found (Debian: libibverbs-dev)])])
  ])
  AS_IF([test "x$gcoll_have_verbs" = xyes], [gcoll_verbs_summary=",verbs"], [gcoll_verbs_summary=""])
  AC_SUBST([VERBS_CFLAGS])
  AM_CONDITIONAL([HAVE_VERBS], [test "x$gcoll_have_verbs" = xyes])
])
