"""The `sampling` route family: spec.py (family spec), sizing.py (workspace / block sizes), reference.py
(fp32 oracle), kernels.py (Triton), launch.py (launchers),
routes.py (registrations). Importing the package is light: no torch or triton."""
