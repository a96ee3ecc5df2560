"""The real deepinfer 0.1.0 source distribution: fetched, checked, cached, read as text.

It is never imported or built (setup.py needs torch for CUDA, and the package needs SM100
GPUs): its API is read from the source with `ast` and regular expressions. The file comes
from the package index pip itself is configured with (PIP_INDEX_URL, pip's configuration,
else pip's default), through the simple API, and must match the sha256 pinned here; it is
cached under $ROLLOUT_CACHE/deepinfer-sdist/.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

VERSION = "0.1.0"
FILENAME = f"deepinfer-{VERSION}.tar.gz"
SHA256 = "959b9bd010893b4c6dc60be0dd822e10e7f1ae1e53289233a83741f76c3d681a"


class Unavailable(Exception):
    """The package index could not be reached: the contract test is skipped, saying why."""


def index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                             capture_output=True, text=True)  # fmt: skip
        url = out.stdout.strip() if out.returncode == 0 else ""
    if not url:
        from pip._internal.models.index import PyPI

        url = PyPI.simple_url
    return url.rstrip("/")


def _cache_path() -> Path:
    root = Path(os.environ.get("ROLLOUT_CACHE") or Path.home() / ".cache" / "rollout")
    return root / "deepinfer-sdist" / FILENAME


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@cache
def fetch() -> Path:
    """The sdist on disk, checked against SHA256; downloaded once."""
    path = _cache_path()
    if path.is_file() and _sha256(path.read_bytes()) == SHA256:
        return path
    page = f"{index_url()}/deepinfer/"
    try:
        req = urllib.request.Request(
            page, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
        listing = json.loads(urllib.request.urlopen(req, timeout=60).read())
        entry = next((f for f in listing["files"] if f["filename"] == FILENAME), None)
        if entry is None:
            raise AssertionError(f"the index at {page} does not list {FILENAME}")
        listed = entry.get("hashes", {}).get("sha256")
        assert listed == SHA256, f"the index lists sha256 {listed} for {FILENAME}, pinned {SHA256}"
        data = urllib.request.urlopen(entry["url"], timeout=300).read()
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise Unavailable(f"the package index ({page}) cannot be reached: {exc}") from None
    assert _sha256(data) == SHA256, f"{FILENAME} from {page} does not match the pinned sha256"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


@cache
def read(member: str) -> str:
    """A file of the sdist, by its path inside the package (e.g. deepinfer/environ.py)."""
    with tarfile.open(fetch()) as tar:
        f = tar.extractfile(f"deepinfer-{VERSION}/{member}")
        assert f is not None, member
        return f.read().decode("utf-8")


def _parse(source: str) -> ast.Module:
    # The package needs Python 3.12 and uses its generic classes (`class EnvVar[T]:`), which
    # a 3.11 parser refuses: drop the type-parameter list, which nothing here reads.
    return ast.parse(re.sub(r"^class (\w+)\[[^\]]*\]:", r"class \1:", source, flags=re.M))


def _class(source: str, name: str) -> ast.ClassDef:
    return next(
        n for n in ast.walk(_parse(source)) if isinstance(n, ast.ClassDef) and n.name == name
    )


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def signature(fn: ast.FunctionDef) -> dict[str, Any]:
    """{parameter: default} (a marker where there is none), and '**' for **kwargs."""
    args = fn.args.args[1:] if fn.args.args and fn.args.args[0].arg == "self" else fn.args.args
    defaults = [ast.literal_eval(d) for d in fn.args.defaults]
    missing = ["<required>"] * (len(args) - len(defaults))
    out = {a.arg: d for a, d in zip(args, missing + defaults, strict=True)}
    if fn.args.kwarg is not None:
        out["**"] = fn.args.kwarg.arg
    return out


def sampling_params_signature() -> dict[str, Any]:
    return signature(
        _method(_class(read("deepinfer/sampling_params.py"), "SamplingParams"), "__init__")
    )


def llm_signatures() -> dict[str, dict[str, Any]]:
    cls = _class(read("deepinfer/entrypoints/llm.py"), "LLM")
    return {
        name: signature(_method(cls, name))
        for name in ("__init__", "generate", "get_tokenizer", "close")
    }


def request_output_members() -> dict[str, set[str]]:
    """RequestOutput in deepinfer/_C/engine.pyi: its properties (attributes) and static methods."""
    cls = _class(read("deepinfer/_C/engine.pyi"), "RequestOutput")
    props, statics = set(), set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            names = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
            (props if "property" in names else statics if "staticmethod" in names else set()).add(
                node.name
            )
    return {"attributes": props, "static": statics}


def finish_reasons() -> list[str]:
    """The strings get_finished_reason returns (csrc/engine/sequence.hpp), in order."""
    source = read("csrc/engine/sequence.hpp")
    body = source[source.index("get_finished_reason") :]
    body = body[: body.index("default:")]
    return re.findall(r'return "([^"]*)";', body)


def _constant(node: ast.expr) -> Any:
    """A literal, or arithmetic on literals (`10 * 2**30`), evaluated without names."""
    allowed = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Tuple, ast.Load)
    assert all(isinstance(n, allowed) for n in ast.walk(node)), ast.dump(node)
    return eval(compile(ast.Expression(node), "<environ default>", "eval"), {"__builtins__": {}})


def environ_defaults() -> dict[str, Any]:
    """Every variable of `class envs` in deepinfer/environ.py, with its default as the source
    states it (factories' default=..., or the literal a custom parser falls back to)."""
    source = re.sub(
        r"^class (\w+)\[[^\]]*\]:", r"class \1:", read("deepinfer/environ.py"), flags=re.M
    )
    cls = _class(source, "envs")
    out: dict[str, Any] = {}
    for node in cls.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name, call = node.targets[0].id, node.value
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                kind = call.func.attr  # EnvVar.int / bool / float / str / choice / str_or_none ...
                kw = {k.arg: _constant(k.value) for k in call.keywords if k.arg == "default"}
                defaults = {"int": 0, "float": 0.0, "bool": False, "str": "", "choice": None}
                out[name] = kw.get("default", defaults.get(kind))
            else:  # EnvVar(lambda v: _float(v, 14400)) and the like
                numbers = re.findall(r"_(?:float|int)\(v, ([0-9.]+)\)", ast.get_source_segment(source, call) or "")  # fmt: skip
                out[name] = float(numbers[0]) if numbers else "<custom>"
        elif isinstance(node, ast.FunctionDef):  # @EnvVar def NAME(v): raw = v if ... else "1.0"
            literal = re.search(r'else "([^"]*)"', ast.get_source_segment(source, node) or "")
            out[node.name] = float(literal.group(1)) if literal else "<custom>"
    return out


def requires_dist() -> dict[str, str]:
    """deepinfer's pinned dependencies (PKG-INFO Requires-Dist): {name: version}."""
    pins = {}
    for line in read("PKG-INFO").splitlines():
        match = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)==([^;\s]+)", line)
        if match:
            pins[match.group(1)] = match.group(2)
    return pins
