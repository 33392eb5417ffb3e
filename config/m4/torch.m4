# torch.m4: the Python interpreter of the binding and the torch the torch.distributed
# backend (bindings/python/csrc, a c10d::Backend) builds against. --with-torch=yes|no|auto
# (default auto). The interpreter: TORCH_PYTHON if set, else $(srcdir)/.venv/bin/python
# when present (what .ci/run makes), else the python3 on PATH when its torch is >= 2.4,
# else that python3 for the pure-Python binding alone. The backend needs torch >= 2.4 (the
# c10d::Backend plugin API with register_backend(..., devices=)); with an older torch or
# none, the rest is built and configure says why the backend is not. The extension is plain
# g++ against the headers torch itself reports, not a setup.py: torch's cpp_extension would
# rebuild the flags configure already knows (bindings/python/pyproject.toml is the pip route).
# Sets TORCH_CXX, TORCH_CXXFLAGS, TORCH_LIBS, TORCH_EXT_SUFFIX, TORCH_PYTHON_DIR and the
# conditionals HAVE_PYTHON (install the package) and HAVE_TORCH (build the extension).
AC_DEFUN([GCOLL_CHECK_TORCH], [
  AC_ARG_WITH([torch],
    [AS_HELP_STRING([--with-torch@<:@=yes|no|auto@:>@], [build the torch.distributed backend "gcoll" (default auto)])],
    [], [with_torch=auto])
  AC_ARG_WITH([python-dir],
    [AS_HELP_STRING([--with-python-dir=DIR], [where make install puts the Python package gcoll (default LIBDIR/pythonX.Y/dist-packages or site-packages)])],
    [], [with_python_dir=])
  AC_ARG_VAR([TORCH_PYTHON], [Python interpreter of the binding and the backend (default $(srcdir)/.venv/bin/python, else python3 on PATH)])
  AS_IF([test -z "$TORCH_PYTHON" && test -x "$srcdir/.venv/bin/python"],
    [TORCH_PYTHON=`cd "$srcdir" && pwd`/.venv/bin/python])
  AS_IF([test -z "$TORCH_PYTHON"], [AC_PATH_PROG([TORCH_PYTHON], [python3])])
  gcoll_have_python=no
  gcoll_have_torch=no
  gcoll_torch_why=""
  AS_IF([test -n "$TORCH_PYTHON" && "$TORCH_PYTHON" -c 'import sys' >/dev/null 2>&1],
    [gcoll_have_python=yes
     gcoll_pyver=`"$TORCH_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[[:2]])'`
     gcoll_pylayout=`"$TORCH_PYTHON" -c 'import sysconfig; p = sysconfig.get_paths()[["purelib"]]; print("dist-packages" if "dist-packages" in p else "site-packages")'`
     AS_IF([test -n "$with_python_dir"], [TORCH_PYTHON_DIR=$with_python_dir],
           [TORCH_PYTHON_DIR='${libdir}'/python$gcoll_pyver/$gcoll_pylayout])],
    [gcoll_torch_why="no Python interpreter (set TORCH_PYTHON)"])

  AS_IF([test "x$with_torch" != xno && test "x$gcoll_have_python" = xyes], [
    AC_MSG_CHECKING([for torch in $TORCH_PYTHON])
    gcoll_torch_info=`"$TORCH_PYTHON" -c '
import sysconfig, torch
from torch.utils import cpp_extension as ce
print(torch.__version__)
print(sysconfig.get_config_var("EXT_SUFFIX"))
print(sysconfig.get_paths()[["include"]])
print(" ".join(ce.include_paths()))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(int(torch.distributed.is_available()))
print(" ".join(ce.library_paths()))
v = torch.__version__.split("+")[[0]].split(".")
print(int((int(v[[0]]), int(v[[1]])) >= (2, 4)))
' 2>/dev/null`
    AS_IF([test -n "$gcoll_torch_info"],
      [gcoll_torch_version=`echo "$gcoll_torch_info" | sed -n 1p`
       TORCH_EXT_SUFFIX=`echo "$gcoll_torch_info" | sed -n 2p`
       gcoll_pyinc=`echo "$gcoll_torch_info" | sed -n 3p`
       gcoll_torch_inc=`echo "$gcoll_torch_info" | sed -n 4p`
       gcoll_torch_abi=`echo "$gcoll_torch_info" | sed -n 5p`
       gcoll_torch_dist=`echo "$gcoll_torch_info" | sed -n 6p`
       gcoll_torch_libdirs=`echo "$gcoll_torch_info" | sed -n 7p`
       gcoll_torch_new=`echo "$gcoll_torch_info" | sed -n 8p`
       AC_MSG_RESULT([$gcoll_torch_version])
       gcoll_have_torch=yes],
      [AC_MSG_RESULT([no])
       gcoll_torch_why="$TORCH_PYTHON cannot import torch (make a venv: python3 -m venv .venv && .venv/bin/pip install torch==2.13.0)"])
    AS_IF([test "x$gcoll_have_torch" = xyes && test "x$gcoll_torch_new" != x1],
      [gcoll_have_torch=no
       gcoll_torch_why="the backend needs torch >= 2.4, $TORCH_PYTHON has torch $gcoll_torch_version"])
    AS_IF([test "x$gcoll_have_torch" = xyes && test "x$gcoll_torch_dist" != x1],
      [gcoll_have_torch=no; gcoll_torch_why="this torch has no torch.distributed"])
    AS_IF([test "x$gcoll_have_torch" = xyes && test "x$enable_shared" = xno],
      [gcoll_have_torch=no; gcoll_torch_why="--disable-shared (the extension links libgcoll.so)"])
    AS_IF([test "x$gcoll_have_torch" = xyes],
      [AC_CHECK_PROGS([TORCH_CXX], [g++ c++ clang++])
       AS_IF([test -z "$TORCH_CXX"], [gcoll_have_torch=no; gcoll_torch_why="no C++ compiler (Debian: g++)"])])
    AS_IF([test "x$gcoll_have_torch" = xyes], [
      TORCH_CXXFLAGS="-std=c++17 -O2 -g -fPIC -shared -Wall -Wextra -fvisibility=hidden"
      TORCH_CXXFLAGS="$TORCH_CXXFLAGS -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_torch_backend"
      TORCH_CXXFLAGS="$TORCH_CXXFLAGS -D_GLIBCXX_USE_CXX11_ABI=$gcoll_torch_abi"
      # torch's include paths as system headers: -Wextra is for our code, not theirs. The
      # dangling TH/THC entries torch reports on Debian are left out.
      for d in $gcoll_torch_inc $gcoll_pyinc; do
        AS_IF([test -d "$d"], [TORCH_CXXFLAGS="$TORCH_CXXFLAGS -isystem $d"])
      done
      AC_MSG_CHECKING([for torch/extension.h and pybind11/pybind11.h])
      AS_IF([echo '#include <torch/extension.h>' | $TORCH_CXX $TORCH_CXXFLAGS -x c++ -E - >/dev/null 2>&1],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no]); gcoll_have_torch=no
         gcoll_torch_why="torch's C++ headers or its pybind11 are missing (a CPU wheel of torch has both)"])
      TORCH_LIBS=""
      for d in $gcoll_torch_libdirs; do TORCH_LIBS="$TORCH_LIBS -L$d"; done
      TORCH_LIBS="$TORCH_LIBS -ltorch -ltorch_cpu -lc10 -ltorch_python"
    ])
  ])
  AS_IF([test "x$with_torch" = xno], [gcoll_torch_why="--without-torch"])
  AS_IF([test "x$with_torch" = xyes && test "x$gcoll_have_torch" = xno],
    [AC_MSG_ERROR([--with-torch was given but the backend cannot be built: $gcoll_torch_why])])
  AS_IF([test "x$gcoll_have_torch" = xno && test "x$with_torch" = xauto],
    [AC_MSG_WARN([torch.distributed backend not built: $gcoll_torch_why])])
  AC_SUBST([TORCH_CXX])
  AC_SUBST([TORCH_CXXFLAGS])
  AC_SUBST([TORCH_LIBS])
  AC_SUBST([TORCH_EXT_SUFFIX])
  AC_SUBST([TORCH_PYTHON_DIR])
  TORCH_WHY=$gcoll_torch_why
  AC_SUBST([TORCH_WHY])
  AM_CONDITIONAL([HAVE_PYTHON], [test "x$gcoll_have_python" = xyes])
  AM_CONDITIONAL([HAVE_TORCH], [test "x$gcoll_have_torch" = xyes])
  AS_IF([test "x$gcoll_have_torch" = xyes],
    [gcoll_torch_summary="yes (torch $gcoll_torch_version, $TORCH_PYTHON)"],
    [gcoll_torch_summary="no ($gcoll_torch_why)"])
])
