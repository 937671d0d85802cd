"""The synthetic workload, service-neutral: the user universe (`universe.py`) that the retrieval stub serves
and that tools and tests draw requests from. Like `services/common`, it imports no service."""
