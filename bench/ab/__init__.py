"""The fixed-load A/B (`python -m bench ab`): `config`, the runs in `__main__`, `schema` and `report`."""
