"""Scale-out on Ray: engine replicas in processes of their own (``replica``), and
the front end's view of them as one ``EngineAPI`` (``router``: session affinity, frames
streamed back, failover from a per-session ``journal``; ``pool``: starting, polling and
stopping the replicas; ``scaling``: how many, a surplus one drained before it stops;
``placement``: where a session goes). Imported only with
``worldstream play --replicas``: without it nothing here (nor Ray) is loaded."""
