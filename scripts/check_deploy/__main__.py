"""Runs every check; prints one line per check, then "N passed, M failed"."""

import os
import sys
import traceback

from . import common, compose, dockerfile, grafana, kubernetes, rabbitmq, versions  # noqa: F401 (registers checks)


def main() -> int:
    # Order: compose, broker and database files, Dockerfile, dashboard; then one
    # line per Kubernetes manifest; then the Kubernetes cross-checks.
    cross = [c for c in common.CHECKS if c[0].startswith("kubernetes:")]
    checks = [c for c in common.CHECKS if c not in cross]
    checks += kubernetes.file_checks() + cross
    # scripts/check-deploy ran the tools first: their counts.
    passed, failed = int(os.environ.get("CHECKS_PASSED", 0)), int(os.environ.get("CHECKS_FAILED", 0))
    for name, fn in checks:
        try:
            detail = fn()
        except common.CheckFailed as e:
            failed += 1
            print(f"FAIL {name}\n     {e}")
        except Exception as e:  # a bug or an unexpected shape: report, keep going
            failed += 1
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {name}\n     {type(e).__name__}: {e} ({where.filename}:{where.lineno})")
        else:
            passed += 1
            print(f"ok   {name}" + (f" ({detail})" if detail else ""))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


sys.exit(main())
