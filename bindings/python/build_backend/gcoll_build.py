# gcoll_build.py: the PEP 517 build backend of bindings/python (see pyproject.toml).
"""Builds a wheel of the package gcoll: its Python files, the C++ extension
gcoll._torch_backend compiled with g++ against the torch of the environment pip installs
into (torch >= 2.4; without it the wheel has no backend and says so at build time), and
gcoll/_libpath.py naming the directory of the libgcoll it was linked with. PEP 517
(build_wheel, build_sdist) and PEP 427 (the wheel format: a zip with a .dist-info holding
METADATA, WHEEL and RECORD with each file's sha256)."""

import base64
import hashlib
import json
import os
import shlex
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bindings/python
NAME = "gcoll"

# Run by the target environment's interpreter: what the extension is built against.
_PROBE = r"""
import json, sysconfig
out = {"ext": sysconfig.get_config_var("EXT_SUFFIX"), "pyinc": sysconfig.get_paths()["include"],
       "tag": None}
try:
    import torch
    from torch.utils import cpp_extension as ce
    v = torch.__version__.split("+")[0].split(".")
    out.update(torch=torch.__version__, new=(int(v[0]), int(v[1])) >= (2, 4),
               inc=ce.include_paths(), libs=ce.library_paths(),
               abi=int(torch._C._GLIBCXX_USE_CXX11_ABI))
except Exception as e:
    out.update(torch=None, why=str(e))
print(json.dumps(out))
"""


def _target_python():
    """The interpreter of the environment pip installs into, with its own sys.path: pip's
    isolated build puts its overlay in PYTHONPATH, which is dropped here."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE",
                                                            "PYTHONHOME")}
    py = os.environ.get("TORCH_PYTHON") or sys.executable
    return py, env


def _version():
    with open(os.path.join(HERE, "..", "..", "configure.ac")) as f:
        for line in f:
            if line.startswith("AC_INIT("):
                return line.split(",")[1].strip(" []\n")
    return "0"


def _gcoll_flags():
    """(cflags, libs, libdir) of libgcoll: GCOLL_PREFIX, else pkg-config gcoll."""
    prefix = os.environ.get("GCOLL_PREFIX")
    if prefix:
        libdir = os.path.join(prefix, "lib")
        return ["-I" + os.path.join(prefix, "include")], ["-L" + libdir, "-lgcoll"], libdir
    try:
        cflags = subprocess.check_output(["pkg-config", "--cflags", "gcoll"], text=True)
        libs = subprocess.check_output(["pkg-config", "--libs", "gcoll"], text=True)
        libdir = subprocess.check_output(["pkg-config", "--variable=libdir", "gcoll"],
                                         text=True).strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError("gcoll: libgcoll not found (%s): install it (make install) so that "
                           "pkg-config finds gcoll.pc (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig), "
                           "or set GCOLL_PREFIX=PREFIX" % e)
    return shlex.split(cflags), shlex.split(libs), libdir


def _build_extension(outdir, libdir, cflags, libs):
    py, env = _target_python()
    info = json.loads(subprocess.check_output([py, "-c", _PROBE], env=env, text=True))
    if not info.get("torch") or not info.get("new"):
        why = info.get("why") or "torch %s is older than 2.4" % info.get("torch")
        sys.stderr.write("gcoll: the torch.distributed backend is not built: %s (it needs "
                         "torch >= 2.4 in %s)\n" % (why, py))
        return None
    src = os.path.join(HERE, "csrc", "backend.cpp")
    out = os.path.join(outdir, "_torch_backend" + info["ext"])
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-O2", "-fPIC", "-shared",
           "-fvisibility=hidden", "-DTORCH_API_INCLUDE_EXTENSION_H",
           "-DTORCH_EXTENSION_NAME=_torch_backend",
           "-D_GLIBCXX_USE_CXX11_ABI=%d" % info["abi"]]
    for d in info["inc"] + [info["pyinc"]]:
        cmd += ["-isystem", d]
    cmd += cflags + ["-o", out, src] + libs + ["-Wl,-rpath," + libdir]
    cmd += ["-L" + d for d in info["libs"]] + ["-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python"]
    sys.stderr.write("gcoll: building the backend against torch %s: %s\n"
                     % (info["torch"], " ".join(cmd)))
    subprocess.check_call(cmd)
    return out, info["ext"]


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arc, digest, len(data))


def _metadata(version):
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: gcoll's Python binding, "
            "torch.distributed backend and DDP hook\nRequires-Python: >=3.9\n"
            "Requires-Dist: numpy\n" % (NAME, version))


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """The .dist-info without compiling (pip asks for it before build_wheel)."""
    version = _version()
    dist = "%s-%s.dist-info" % (NAME, version)
    os.makedirs(os.path.join(metadata_directory, dist), exist_ok=True)
    with open(os.path.join(metadata_directory, dist, "METADATA"), "w") as f:
        f.write(_metadata(version))
    return dist


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    cflags, libs, libdir = _gcoll_flags()
    with tempfile.TemporaryDirectory() as tmp:
        built = _build_extension(tmp, libdir, cflags, libs)
        files = {}
        pkg = os.path.join(HERE, "gcoll")
        for f in sorted(os.listdir(pkg)):
            if f.endswith(".py"):
                with open(os.path.join(pkg, f), "rb") as fh:
                    files["gcoll/" + f] = fh.read()
        files["gcoll/_libpath.py"] = (
            "# _libpath.py: written by pip's build (gcoll_build.py): where libgcoll was found.\n"
            "LIBDIR = %r\n" % libdir).encode()
        if built:
            with open(built[0], "rb") as fh:
                files["gcoll/" + os.path.basename(built[0])] = fh.read()
            tag = "cp%d%d-cp%d%d-%s" % (sys.version_info[:2] * 2 + (
                sysconfig.get_platform().replace("-", "_").replace(".", "_"),))
        else:
            tag = "py3-none-any"
        dist = "%s-%s.dist-info" % (NAME, version)
        files[dist + "/METADATA"] = _metadata(version).encode()
        files[dist + "/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: gcoll_build\n"
                                  "Root-Is-Purelib: %s\nTag: %s\n"
                                  % ("false" if built else "true", tag)).encode()
        record = [_record_line(a, d) for a, d in files.items()] + [dist + "/RECORD,,"]
        files[dist + "/RECORD"] = ("\n".join(record) + "\n").encode()
        name = "%s-%s-%s.whl" % (NAME, version, tag)
        with zipfile.ZipFile(os.path.join(wheel_directory, name), "w",
                             zipfile.ZIP_DEFLATED) as z:
            for arc, data in files.items():
                z.writestr(arc, data)
    return name


def build_sdist(sdist_directory, config_settings=None):
    version = _version()
    base = "%s-%s" % (NAME, version)
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for sub in ("pyproject.toml", "gcoll", "csrc", "build_backend"):
            t.add(os.path.join(HERE, sub), arcname=base + "/" + sub,
                  filter=lambda i: None if i.name.endswith((".so", ".pyc")) or
                  "__pycache__" in i.name else i)
    return name
