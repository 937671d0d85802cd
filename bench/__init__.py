"""RelayGR's benchmark: baseline and RelayGR fleets side by side (`python -m bench`, `make bench`)."""
