"""`python -m worldstep.fidelity --help`."""

import json

from worldstep.fidelity.report import main

if __name__ == "__main__":
    report = main()
    print(json.dumps({"targets": report["targets"], "files": report["files"]}, indent=2))
