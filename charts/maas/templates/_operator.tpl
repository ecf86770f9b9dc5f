{{/*
The namespaces whose ModelDeployments the operator runs, as a JSON list: the
release's own (where the example lives) and the ones named. Each gets the
operator's Role and the engines' NetworkPolicy.
*/}}
{{- define "maas.operatorNamespaces" -}}
{{- toJson (prepend .Values.operator.watchNamespaces .Release.Namespace | uniq) -}}
{{- end -}}

{{/*
Image patterns a ModelDeployment may name, as a JSON list: the release's own
image at any tag or digest, the engine image the values name, and the extra
patterns in operator.allowedImages.
*/}}
{{- define "maas.allowedImages" -}}
{{- $v := .Values.operator }}
{{- $own := list (printf "%s:*" .Values.image.repository) (printf "%s@*" .Values.image.repository) }}
{{- toJson (concat $own (compact (list $v.engineImage)) $v.allowedImages | uniq) -}}
{{- end -}}
