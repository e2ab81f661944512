{{/* Names: <release>-vgpu-operator unless the release name already contains the chart name. */}}
{{- define "vgpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vgpu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "vgpu.operator.name" -}}{{ include "vgpu.fullname" . | trunc 54 | trimSuffix "-" }}{{- end -}}
{{- /* 41 + "-device-plugin" + "-monitor" (its Service) = 63, the most a Service name may have. */ -}}
{{- define "vgpu.plugin.name" -}}{{ printf "%s-device-plugin" (include "vgpu.fullname" . | trunc 41 | trimSuffix "-") }}{{- end -}}

{{/* Standard labels on every object; component-specific ones are added by the callers. */}}
{{- define "vgpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "vgpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vgpu-operator
{{- /* Never the chart's own keys: a selector must keep matching its pods. */ -}}
{{- with omit .Values.commonLabels "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "app.kubernetes.io/part-of" "app.kubernetes.io/component" }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels: stable across upgrades (never add the version here). */}}
{{- define "vgpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vgpu.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "vgpu.componentLabels" -}}
{{ include "vgpu.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Pull secrets of both ServiceAccounts (the pods pull with their ServiceAccount's). */}}
{{- define "vgpu.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
An image reference: [registry/]repository, then @digest when one is set (it pins the image, a tag
beside it would only mislead), else :tag (empty: the chart's appVersion). global.imageRegistry, a
mirror, replaces the registry of every image. A repository that starts with a host (a first part
with "." or ":", or localhost) is a whole name, as values of chart 0.1.0 before `registry` gave
it: the image's own registry is not prefixed, and a global mirror cannot be applied to it.
*/}}
{{- define "vgpu.image" -}}
{{- $global := .root.Values.global | default dict -}}
{{- $name := .image.repository -}}
{{- $first := first (splitList "/" $name) -}}
{{- $hosted := and (contains "/" $name) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $registry := ternary "" .image.registry $hosted -}}
{{- if $global.imageRegistry -}}
{{- if $hosted -}}
{{- fail (printf "%s.repository %q names a registry (%s), which global.imageRegistry would be put in front of; set %s.repository without it (and %s.registry if needed)" .field $name $first .field .field) -}}
{{- end -}}
{{- $registry = $global.imageRegistry -}}
{{- end -}}
{{- if $registry }}{{ $name = printf "%s/%s" $registry $name }}{{ end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $name .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Where the device plugin the policy manages lives: ours, or the adopted upstream one. */}}
{{- define "vgpu.plugin.namespace" -}}
{{- if .Values.devicePlugin.enabled -}}{{ .Release.Namespace }}{{- else -}}{{ .Values.existingDevicePlugin.namespace }}{{- end -}}
{{- end -}}

{{- /* node-config is mounted by the plugin's DaemonSet, so it lives in the plugin's namespace;
device-config stays in targets.namespace, where the scheduler looks. */ -}}
{{- define "vgpu.nodeConfig.namespace" -}}
{{ include "vgpu.plugin.namespace" . }}
{{- end -}}

{{- define "vgpu.plugin.daemonSet" -}}
{{- if .Values.devicePlugin.enabled -}}{{ include "vgpu.plugin.name" . }}{{- else -}}{{ .Values.existingDevicePlugin.daemonSet }}{{- end -}}
{{- end -}}

{{- define "vgpu.plugin.container" -}}
{{- if .Values.devicePlugin.enabled -}}device-plugin{{- else -}}{{ .Values.existingDevicePlugin.container }}{{- end -}}
{{- end -}}

{{/*
The namespaces the operator watches (kopf --namespace): the scheduler's, the rendered
ConfigMaps' and the device plugin's. The operator's namespaced RBAC is granted in exactly these
(plus `default`, the one namespace where the API server accepts Events about cluster-scoped
objects such as the VGPUPolicy). Output: a JSON list.
*/}}
{{- define "vgpu.watchedNamespaces" -}}
{{- list .Values.scheduler.namespace .Values.targets.namespace (include "vgpu.plugin.namespace" .) | uniq | toJson -}}
{{- end -}}

{{- define "vgpu.roleNamespaces" -}}
{{- append (include "vgpu.watchedNamespaces" . | fromJsonArray) "default" | uniq | toJson -}}
{{- end -}}

{{/*
Where the policy's targets live, as the VGPUPolicy spec spells it (JSON): the default policy
carries exactly these, and the RBAC is granted for exactly these.
*/}}
{{- define "vgpu.policyLocations" -}}
{{- $v := .Values -}}
{{- toJson (dict
  "scheduler" (dict "namespace" $v.scheduler.namespace "configMap" $v.scheduler.configMap "key" $v.scheduler.key "deployment" $v.scheduler.deployment)
  "devicePlugin" (dict "namespace" (include "vgpu.plugin.namespace" .) "daemonSet" (include "vgpu.plugin.daemonSet" .) "container" (include "vgpu.plugin.container" .) "generation" (ternary "builtin" $v.existingDevicePlugin.generation $v.devicePlugin.enabled))
  "targets" (dict "deviceConfig" (dict "namespace" $v.targets.namespace "name" $v.targets.deviceConfig) "nodeConfig" (dict "namespace" (include "vgpu.nodeConfig.namespace" .) "name" $v.targets.nodeConfig))
) -}}
{{- end -}}

{{/*
Values this chart needs that an older chart did not have. `helm upgrade --reuse-values` keeps the
previous release's values, the old chart's defaults included, and never adds this chart's: a
missing key would crash a template, or drop a hardening setting without a word (an absent
securityContext renders none). Fail instead, naming the key and the fix. The keys checked are ones
no user has a reason to null (a null securityContext is a user's way to drop it): any values
without them predate them, and so lack the security contexts too.
*/}}
{{- define "vgpu.requireCurrentValues" -}}
{{- range $path := list "logging.level" "logging.format" "metrics.prometheusRule.alerts" -}}
{{- $node := $.Values.AsMap -}}
{{- range $key := splitList "." $path -}}
{{- if not (and (kindIs "map" $node) (hasKey $node $key)) -}}
{{- fail (printf "value %s is missing: these values come from an older chart (helm upgrade --reuse-values keeps the old chart's defaults, not this chart's); upgrade with --reset-then-reuse-values, or give the new chart's values.yaml" $path) -}}
{{- end -}}
{{- $node = get $node $key -}}
{{- end -}}
{{- end -}}
{{- end -}}
