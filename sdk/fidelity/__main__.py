"""`python -m worldstep.fidelity --help`."""

import json

from worldstep.fidelity.report import main

if __name__ == "__main__":
    report = main()
    if "stopped" in report:  # --stop-after-minutes spent: no report yet, --resume continues
        print(json.dumps(report, indent=2))
    else:
        print(json.dumps({"targets": report["targets"], "files": report["files"]}, indent=2))
