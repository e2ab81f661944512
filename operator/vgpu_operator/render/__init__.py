"""Pure renderers: a `ClusterView` -> the desired state of one target object (`TargetRender`).

One module per target (`device_config`, `node_config`, `scheduler_conf`, `scheduler_deployment`,
`device_plugin`), listed in `vgpu_operator.registry`, which renders them in order. Each is
deterministic (same view, same bytes) and edits only what it owns. A target whose input is
unusable (malformed scheduler conf, missing container, unknown plugin generation) gets `error` and
no `desired`; the other targets render as usual.
"""
