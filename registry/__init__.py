"""intentbus registry: label-based lookup of executors (issue 3; not built yet).

The package exists so the layout is fixed from the start; it exports nothing yet.
"""

__all__: list[str] = []
