# cmocka.m4: CMocka for the unit tests (make check needs it).
AC_DEFUN([GCOLL_CHECK_CMOCKA], [
  gcoll_have_cmocka=no
  PKG_CHECK_MODULES([CMOCKA], [cmocka], [gcoll_have_cmocka=yes],
    [AC_MSG_WARN([CMocka not found (Debian: libcmocka-dev): unit tests will not be built])])
  AM_CONDITIONAL([HAVE_CMOCKA], [test "x$gcoll_have_cmocka" = xyes])
])
