#!/usr/bin/env python3
"""The in-container probe: what software a benchmark image really holds.

Runs with the image's own Python (3.6 or later, standard library only) and prints one
JSON document on stdout. Every probe fails soft: {"value": null, "reason": "..."}.
Each framework is imported in a child process of its own, so that one that crashes or
hangs on import cannot take the others down.

    python3 probe-container.py [--source PATH]... [--timeout SECONDS]
"""
import glob
import json
import os
import platform
import re
import subprocess
import sys
import time

PROBE_VERSION = 1
MARK = "@@repro-probe@@"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW(OR)?D|KEY|AUTH|CREDENTIAL", re.I)

# Run in a child: PRELUDE, then one framework's snippet, which fills `out`.
PRELUDE = r'''
import json, sys
out = {"version": None, "build": {}}
def attempt(key, fn):
    try:
        v = fn()
        out["build"][key] = v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)
    except Exception as e:
        out["build"][key] = None
        out["build"][key + "_reason"] = "%s: %s" % (type(e).__name__, e)
def done():
    sys.stdout.flush()
    print("\n@@repro-probe@@" + json.dumps(out, default=str))
'''

FRAMEWORKS = {
    "torch": ("torch", r'''
import torch
out["version"] = torch.__version__
attempt("cuda", lambda: torch.version.cuda)
attempt("git", lambda: torch.version.git_version)
attempt("cudnn", lambda: torch.backends.cudnn.version())
attempt("cuda_available", lambda: torch.cuda.is_available())
if torch.version.cuda:
    attempt("nccl", lambda: ".".join(map(str, torch.cuda.nccl.version()))
            if isinstance(torch.cuda.nccl.version(), tuple) else torch.cuda.nccl.version())
attempt("config", lambda: torch.__config__.show())
done()
'''),
    "paddle": ("paddle", r'''
import paddle
out["version"] = paddle.__version__
v = paddle.version
attempt("commit", lambda: v.commit)
attempt("cuda", lambda: v.cuda())
attempt("cudnn", lambda: v.cudnn())
attempt("nccl", lambda: v.nccl())
attempt("with_mkl", lambda: v.with_mkl)
attempt("compiled_with_cuda", lambda: paddle.is_compiled_with_cuda())
done()
'''),
    "tensorflow": ("tensorflow", r'''
import tensorflow as tf
out["version"] = tf.__version__
attempt("git", lambda: tf.version.GIT_VERSION)
attempt("compiler", lambda: tf.version.COMPILER_VERSION)
attempt("build_info", lambda: {k: (v if isinstance(v, (str, int, float, bool)) else str(v))
                               for k, v in dict(tf.sysconfig.get_build_info()).items()})
attempt("cuda", lambda: dict(tf.sysconfig.get_build_info()).get("cuda_version"))
attempt("cudnn", lambda: dict(tf.sysconfig.get_build_info()).get("cudnn_version"))
attempt("built_with_cuda", lambda: tf.test.is_built_with_cuda())
done()
'''),
    "mxnet": ("mxnet", r'''
import mxnet
out["version"] = mxnet.__version__
attempt("features", lambda: sorted(n for n, f in mxnet.runtime.Features().items() if f.enabled))
feats = mxnet.runtime.Features()
attempt("cuda", lambda: feats.is_enabled("CUDA"))
attempt("cudnn", lambda: feats.is_enabled("CUDNN"))
attempt("nccl", lambda: feats.is_enabled("NCCL"))
done()
'''),
    "dali": ("nvidia.dali", r'''
import nvidia.dali as dali
out["version"] = dali.__version__
attempt("git", lambda: getattr(dali, "__git_sha__"))
attempt("cuda", lambda: getattr(dali, "__cuda_version__"))
done()
'''),
    "oneflow": ("oneflow", r'''
import oneflow
out["version"] = oneflow.__version__
attempt("git", lambda: getattr(oneflow, "__git_commit__"))
done()
'''),
}


def ok(value):
    return {"value": value, "reason": None}


def fail(reason):
    return {"value": None, "reason": reason}


def run(argv, timeout=60, env=None):
    """(returncode, stdout, stderr); a missing program is returncode 127."""
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                             env=env, errors="replace")
    except OSError as e:
        return 127, "", "%s: %s" % (argv[0], e.strerror or e)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return 124, out, "timed out after %s s" % timeout
    return p.returncode, out, err


def installed(module):
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except Exception:  # a parent package that fails to import
        return False


def framework(name, timeout):
    module, snippet = FRAMEWORKS[name]
    if not installed(module):
        return fail("not installed (no module %s)" % module)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore", GLOG_minloglevel="3")
    rc, out, err = run([sys.executable, "-c", PRELUDE + snippet], timeout=timeout, env=env)
    for line in reversed(out.splitlines()):
        if line.startswith(MARK):
            return ok(json.loads(line[len(MARK):]))
    tail = (err.strip().splitlines() or ["no output"])[-1]
    return fail("import %s failed (exit %s): %s" % (module, rc, tail[-300:]))


URL_CREDENTIALS = re.compile(r"://[^/@\s]+@")


def pip_freeze():
    """Installed distributions; credentials in direct URLs (pkg @ https://user:token@host/...) are cut."""
    rc, out, err = run([sys.executable, "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
                       timeout=120)
    if rc == 0:
        return ok(sorted(URL_CREDENTIALS.sub("://<redacted>@", line) for line in out.splitlines()
                         if line.strip()))
    try:
        from importlib import metadata
    except ImportError:
        return fail("pip freeze failed (%s) and importlib.metadata is missing" % (err.strip()[-200:] or rc))
    dists = set("%s==%s" % (d.metadata["Name"], d.version) for d in metadata.distributions())
    return {"value": sorted(dists), "reason": "pip freeze failed; listed with importlib.metadata instead"}


def os_release():
    info = {}
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            with open(path) as f:
                for line in f:
                    k, sep, v = line.strip().partition("=")
                    if sep:
                        info[k] = v.strip('"')
            break
        except OSError:
            continue
    if not info:
        return fail("no /etc/os-release")
    return ok({"pretty_name": info.get("PRETTY_NAME"), "id": info.get("ID"),
               "version_id": info.get("VERSION_ID")})


def ofed():
    rc, out, err = run(["ofed_info", "-s"], timeout=30)
    if rc == 0 and out.strip():
        return ok(out.strip().rstrip(":"))
    return fail("ofed_info: not installed" if rc == 127 else "ofed_info -s failed: %s" % (err.strip() or rc))


def rdma_core():
    """The rdma-core user space: its package (or the library file's) version."""
    rc, out, _ = run(["dpkg-query", "-W", "-f", "${source:Package} ${source:Version}\\n",
                      "rdma-core", "libibverbs1", "ibverbs-providers"], timeout=30)
    for line in out.splitlines():
        name, _, version = line.strip().partition(" ")
        if name == "rdma-core" and version:
            return ok({"version": version, "from": "dpkg"})
    rc, out, _ = run(["rpm", "-q", "--qf", "%{VERSION}-%{RELEASE}", "rdma-core"], timeout=30)
    if rc == 0 and out.strip():
        return ok({"version": out.strip(), "from": "rpm"})
    libs = sorted(glob.glob("/usr/lib*/libibverbs.so.1.*") + glob.glob("/usr/lib/*/libibverbs.so.1.*"))
    for lib in libs:
        m = re.search(r"libibverbs\.so\.1\.\d+\.(\d+(\.\d+)?)$", lib)
        if m:
            return ok({"version": m.group(1), "from": lib})
    return fail("no rdma-core package and no libibverbs.so.1 library")


def git_head(path):
    """The commit of a checkout at ``path``: the kit's stamp, git, or .git read by hand."""
    stamp = os.path.join(path, ".repro-source.json")
    if os.path.isfile(stamp):
        try:
            with open(stamp) as f:
                doc = json.load(f)
            return ok({"commit": doc["commit"], "repository": doc.get("repository"),
                       "how": ".repro-source.json", "patches": len(doc.get("patches", []))})
        except (OSError, ValueError, KeyError) as e:
            return fail("unreadable %s: %s" % (stamp, e))
    if not os.path.isdir(path):
        return fail("no such directory")
    rc, out, err = run(["git", "-C", path, "rev-parse", "HEAD"], timeout=30)
    if rc == 0:
        rc2, status, _ = run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"], timeout=60)
        return ok({"commit": out.strip(), "how": "git", "dirty": bool(status.strip()) if rc2 == 0 else None})
    return _read_git_dir(path, err if rc != 127 else "git not installed")


def _read_git_dir(path, why):
    gitdir = os.path.join(path, ".git")
    try:
        if os.path.isfile(gitdir):  # a worktree or submodule: "gitdir: <path>"
            with open(gitdir) as f:
                gitdir = os.path.join(path, f.read().split(":", 1)[1].strip())
        with open(os.path.join(gitdir, "HEAD")) as f:
            head = f.read().strip()
        if not head.startswith("ref: "):
            return ok({"commit": head, "how": ".git/HEAD (detached)", "dirty": None})
        ref = head[5:]
        try:
            with open(os.path.join(gitdir, ref)) as f:
                return ok({"commit": f.read().strip(), "how": ".git/" + ref, "dirty": None})
        except OSError:
            with open(os.path.join(gitdir, "packed-refs")) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and parts[1] == ref:
                        return ok({"commit": parts[0], "how": ".git/packed-refs", "dirty": None})
    except (OSError, IndexError) as e:
        return fail("not a checkout (%s; %s)" % (why.strip()[-120:], e))
    return fail("HEAD names %s, which is not in the repository" % ref)


def env_versions():
    """Version variables base images set (CUDA_VERSION, NCCL_VERSION, ...); never secret-looking names."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.endswith("_VERSION") and not SECRET_NAME.search(k)}


def main(argv):
    sources, timeout, i = [], 300, 0
    while i < len(argv):
        if argv[i] == "--source" and i + 1 < len(argv):
            sources.append(argv[i + 1])
            i += 2
        elif argv[i] == "--timeout" and i + 1 < len(argv):
            timeout = int(argv[i + 1])
            i += 2
        else:
            sys.stderr.write("usage: probe-container.py [--source PATH]... [--timeout SECONDS]\n")
            return 2
    t0 = time.time()
    doc = {
        "probe": "repro-container-probe",
        "probe_version": PROBE_VERSION,
        "python": ok({"version": platform.python_version(),
                      "implementation": platform.python_implementation(),
                      "executable": sys.executable}),
        "os": os_release(),
        "frameworks": {name: framework(name, timeout) for name in FRAMEWORKS},
        "pip_freeze": pip_freeze(),
        "ofed": ofed(),
        "rdma_core": rdma_core(),
        "env_versions": env_versions(),
        "sources": {path: git_head(path) for path in sources},
    }
    doc["seconds"] = round(time.time() - t0, 2)
    sys.stdout.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
