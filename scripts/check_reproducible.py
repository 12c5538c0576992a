"""Does a model compile to the same ``.vtac`` bytes whatever BLAS kernel and thread count the host uses?

Compiles each model in a fresh process per environment -- OpenBLAS core types (``OPENBLAS_CORETYPE``: the kernel
numpy's BLAS would pick on another CPU), BLAS thread counts, and numpy with its AVX-512 and AVX2 code paths turned off
(``NPY_DISABLE_CPU_FEATURES``) -- each with its own empty cache folder, so the zoo's model files are built again too.
Prints each artefact's SHA-256 per environment and, where two differ, which parts differ
(``vta.compiler.runtime.fingerprint``: a layer's instructions, micro-ops, weights, constants, a tensor's scale)::

    python3 scripts/check_reproducible.py                       # tiny_cnn and mini_resnet, four environments
    python3 scripts/check_reproducible.py resnet18 --envs all   # ResNet-18 under every environment below

Exit status 0 when every environment gives the same bytes, 1 when one differs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ENVIRONMENTS: dict[str, dict[str, str]] = {
    "Haswell": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"},
    "SkylakeX": {"OPENBLAS_CORETYPE": "SkylakeX", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
    "Prescott": {"OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"},
    "Zen": {"OPENBLAS_CORETYPE": "Zen", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
    "Sandybridge": {"OPENBLAS_CORETYPE": "Sandybridge", "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"},
    "no-avx512": {"NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL "
                                              "AVX512_SPR", "OPENBLAS_CORETYPE": "Haswell"},
}
"""Environment name -> the variables set for its compiles (on top of the caller's environment)."""
DEFAULT_ENVS = ("Haswell", "SkylakeX", "Prescott", "Zen")

_CHILD = """
import hashlib, json, sys
from vta.compiler.runtime.fingerprint import fingerprint
from vta.compiler.pipeline import compile_model
from vta.compiler.runtime.compiled import Compiled
from vta.config import VTAConfig
out = {}
for model in sys.argv[2:]:
    path = f"{sys.argv[1]}/{model}.vtac"
    compile_model(model, VTAConfig(), calib=2).save(path)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    out[model] = {"sha256": digest, "parts": fingerprint(Compiled.load(path))}
print(json.dumps(out))
"""


def compile_in(env_name: str, models: list[str], folder: Path) -> dict[str, Any]:
    """Compile ``models`` in a fresh process under environment ``env_name`` (:data:`ENVIRONMENTS`), with an empty
    cache folder under ``folder``; model -> ``{"sha256": the .vtac's digest, "parts": its fingerprint}``."""
    work = folder / env_name
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **ENVIRONMENTS[env_name], "VTA_CACHE_DIR": str(work / "cache")}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(work), *models], env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"compiling {', '.join(models)} under {env_name} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def compare(results: dict[str, dict[str, Any]]) -> list[str]:
    """One line per model and environment whose artefact differs from the first environment's, followed by the
    parts that differ; empty when all are the same."""
    from vta.compiler.runtime.fingerprint import differences
    first, *others = results
    lines = []
    for env_name in others:
        for model, got in results[env_name].items():
            ref = results[first][model]
            if got["sha256"] != ref["sha256"]:
                parts = differences(ref["parts"], got["parts"], names=(first, env_name))
                lines.append(f"{model}: the .vtac compiled under {env_name} differs from {first}'s"
                             + "".join(f"\n  {p}" for p in parts or ["(no part differs: the container's bytes do)"]))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=["tiny_cnn", "mini_resnet"], help="zoo models or ONNX files")
    parser.add_argument("--envs", default=",".join(DEFAULT_ENVS),
                        help=f"comma-separated environments, or 'all': {', '.join(ENVIRONMENTS)}")
    args = parser.parse_args(argv)
    names = list(ENVIRONMENTS) if args.envs == "all" else args.envs.split(",")
    unknown = [n for n in names if n not in ENVIRONMENTS]
    if unknown:
        parser.error(f"unknown environment(s) {', '.join(unknown)}; choose from {', '.join(ENVIRONMENTS)}")
    with tempfile.TemporaryDirectory(prefix="vta-repro-") as tmp:
        results = {}
        for name in names:
            results[name] = compile_in(name, args.models, Path(tmp))
            print(f"{name:12s} " + "  ".join(f"{m} {r['sha256'][:16]}" for m, r in results[name].items()), flush=True)
    lines = compare(results)
    for line in lines:
        print(line)
    print(f"different bytes under {len(names)} environments" if lines
          else f"the same bytes under all {len(names)} environments")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
