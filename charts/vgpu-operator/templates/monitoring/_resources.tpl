{{- /*
The resource a pod requests for vGPU slots: the policy's resources.count, else the CRD's default
(tests/charts/test_monitoring.py holds the two together). NOTES.txt, the dashboard's capacity
query and the docs name it from here, so a policy counting `nvidia.com/gpu` is shown as such.
*/ -}}
{{- define "vgpu.countResource" -}}
{{- dig "resources" "count" "volcano.sh/vgpu-number" (.Values.policy.spec | default dict) -}}
{{- end -}}

{{- /* The same name as kube-state-metrics spells it in kube_node_status_allocatable{resource}. */ -}}
{{- define "vgpu.countResource.ksm" -}}
{{- regexReplaceAll "[^a-zA-Z0-9_]" (include "vgpu.countResource" .) "_" -}}
{{- end -}}
