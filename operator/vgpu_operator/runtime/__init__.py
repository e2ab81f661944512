"""The runtime around kopf: what runs, when, and who retries.

    run.run_operator      one operator: the API client, kopf (policy events, finalizer, peering),
                          and our own tasks below, until a stop flag is set
    worker.Worker         reconciles the active policy on triggers, resyncs and, after a failure,
                          with backoff: the only retry of a reconcile
    handlers              kopf handlers: record the policy, trigger the worker, release on delete;
                          the policy's daemon is how peering pauses the worker
    indexes               the policies and nodes seen (which policy is active; trimmed nodes)
    nodes, targets        list + watch of the Nodes and of the objects the active policy names
                          (`watching.list_and_watch`), each change a trigger
    tasks                 which tasks belong to one run, so kopf's shutdown cancels only those

The reconcile itself (read, decide, write, report) is `vgpu_operator.reconcile`.
"""
