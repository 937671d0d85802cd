"""The sequence-aware trigger: admits a request for pre-inference only when ranking it without relay is
predicted to miss the SLO, and only within a cache-footprint bound and a pre-inference load bound.

- `cost_model`: latency prediction fitted to the rankers' measured curve (GetProfile).
- `profile`: what the trigger takes from a GetProfile answer.
- `admission`: `AdmissionPolicy`, the decision and its reasons; pure logic with an injectable clock.
- `servicer`: `TriggerService.Admit`, the gRPC adapter that fires PreInfer through the router.
- `server`: the process lifecycle (server, router channel, profile refresh).
"""
