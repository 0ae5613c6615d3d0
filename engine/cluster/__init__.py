"""Scale-out on Ray (issue 14): engine replicas in processes of their own (``replica``), and
the front end's view of them as one ``EngineAPI`` (``router``: placement, session affinity,
frames streamed back, failover from a per-session ``journal``). Imported only with
``worldstream play --replicas``: without it nothing here (nor Ray) is loaded."""
