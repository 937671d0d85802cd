"""One-off studies behind records in bench/results/, each a `python -m bench.studies.<name>` that reproduces
its record: `focus_16`, `focus_mix1_batched`, `gain_stability`, `placement_ab`, `routing_ab`, `serving_ab`.
"""
