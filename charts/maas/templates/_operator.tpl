{{/*
The namespaces whose ModelDeployments the operator runs, as a JSON list: the
release's own (where the example lives) and the ones named. Each gets the
operator's Role and the engines' NetworkPolicy.
*/}}
{{- define "maas.operatorNamespaces" -}}
{{- toJson (prepend .Values.operator.watchNamespaces .Release.Namespace | uniq) -}}
{{- end -}}

{{/*
The namespaces the operator watches and the router discovers engines in, as
the JSON list both take: the managed namespaces, or [] (every namespace) when
operator.clusterWide opts in.
*/}}
{{- define "maas.watchedNamespaces" -}}
{{- ternary "[]" (include "maas.operatorNamespaces" .) .Values.operator.clusterWide -}}
{{- end -}}

{{/* The ConfigMap the operator writes the gateway's routes into, in the release's namespace. */}}
{{- define "maas.routesConfigMap" -}}
{{- printf "%s-routes" (include "maas.name" (dict "root" . "component" "operator")) -}}
{{- end -}}

{{/*
Image patterns a ModelDeployment may name, as a JSON list: the release's own
image and the vLLM image's repository, each at any tag or digest, the engine
image the values name, and the extra patterns in operator.allowedImages.
*/}}
{{- define "maas.allowedImages" -}}
{{- $v := .Values.operator }}
{{- $own := list }}
{{- range list .Values.image.repository .Values.engine.vllm.image.repository }}
{{- $own = concat $own (list (printf "%s:*" .) (printf "%s@*" .)) }}
{{- end }}
{{- toJson (concat $own (compact (list $v.engineImage)) $v.allowedImages | uniq) -}}
{{- end -}}

{{/* The vLLM image backend-vllm ModelDeployments get when they name none. */}}
{{- define "maas.vllmImage" -}}
{{- printf "%s:%s" .Values.engine.vllm.image.repository .Values.engine.vllm.image.tag -}}
{{- end -}}
