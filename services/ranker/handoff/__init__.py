"""Cache handoff: prefixes that outlive a ranker's membership of the ring.

A rolling restart, a scale-in or a scale-out moves users between rankers; without a handoff each move is
a miss. A ranker knows the ring the routers use (`peers`, from `--rankers` or `--rankers-srv`) and:

- on its drain, pushes its resident prefixes to each user's next owner (`push`), most recently used
  first, within a time budget and a rate;
- receives what peers push, into DRAM only, safely (`services.ranker.cache.admission`, `receive`), and
  serves Push and Fetch to other rankers only (`auth`);
- for a grace window after start-up or a ring change, reads a miss of a user the routers send to it
  through from the peer that served the user meanwhile (`read_through`), and answers such reads
  (`servicer`).

The KV's wire format is `services.ranker.cache.kv_wire`; the contract is `relaygr/v1/handoff.proto`. A
SIGKILL hands nothing off (it loses only caches, as without a handoff); a model rollout carries nothing
(another model version is refused).
"""
