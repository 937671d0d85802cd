"""Studies behind records in bench/results/ that no other command measures, each a command of its own:
`gain_stability` (`python -m bench gain-stability`) and `serving_ab` (`python -m bench serving-ab`).
"""
