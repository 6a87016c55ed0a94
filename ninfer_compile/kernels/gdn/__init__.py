"""The `gdn` route family: reference.py (fp32 oracle), kernels.py (Triton), launch.py (launchers),
routes.py (registrations). Importing the package is light: no torch or triton."""
