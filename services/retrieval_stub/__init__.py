"""The retrieval stub: the cascade's front door (`RecommendService`) over a synthetic user universe."""
