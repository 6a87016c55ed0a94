"""The route library: one sub-package per op family (`kernels/<family>/`).

Each family registers its routes in `kernels/<family>/routes.py` through `kernels.registry`;
the registry imports those modules lazily on first query. Importing this package is light: no
torch, no triton.
"""

from .registry import (  # noqa: F401
    ParamSpec,
    Registry,
    Route,
    RouteDomain,
    all_routes,
    default_registry,
    families,
    get_route,
    register,
    routes_for,
)
