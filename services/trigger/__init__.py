"""The trigger: relays every request whose relay pays (the prefix computation it moves off the critical path
costs more than the PreInfer round trip), and brakes by the measured cost of relaying when the fleet cannot
afford it.

- `cost_model`: the three model paths' latency, fitted to the rankers' measured curve (GetProfile).
- `fleet_profile`: what the trigger takes from a GetProfile answer (cost models, KV size, ring members).
- `fleet_load`: each ranker's load from the reports on PreInfer answers, aged between them.
- `admission`: `AdmissionPolicy`, the decision, its brakes and reasons; pure logic with an injectable clock.
- `coalescer`: `Coalescer`, which gathers the PreInfers bound for one ranker within a short window into one
  PreInferBatch call, and `Alone`, why one goes alone instead.
- `dataplane`: `TriggerPlane.admit`, everything an Admit does, each step once.
- `servicer`: `TriggerService.Admit`, the gRPC adapter that fires PreInfer (`pre_infer_call`) and
  PreInferBatch (`pre_infer_batch_call`).
- `app`: the process's wiring (server, the way to the rankers, profile refresh).
"""
