"""Developer tools that write committed files: `python -m tools.dashboards`, `python -m tools.ghz_data`."""
