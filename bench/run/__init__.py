"""`python -m bench run`: baseline, RelayGR and its ablations side by side. `experiments` measures them in
the host's unit timed at the run's start; `gpu` is the gpu profile's; `__main__` assembles what a run
measured into its results (`assemble`, `summary`) and writes them."""
