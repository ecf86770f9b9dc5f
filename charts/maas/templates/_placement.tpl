{{/*
Where a component's pods may run: nodeSelector, tolerations, affinity and
topologySpreadConstraints, the chart-wide `placement` merged under the
component's own `<component>.placement`:
- nodeSelector and affinity: maps merged key by key (deeply for affinity), the
  component's value winning;
- tolerations: the global ones and the component's, both;
- topologySpreadConstraints: the component's, and the global ones on a
  topologyKey the component does not spread on itself (Kubernetes refuses two
  constraints on one key and whenUnsatisfiable). A constraint without a
  labelSelector counts the component's own pods, so one global "spread across
  zones" spreads each component separately.
Params: root, component, v (the component's values; may hold `placement`).
Renders pod spec fields, or nothing.
*/}}
{{- define "maas.placement" -}}
{{- $global := .root.Values.placement | default dict }}
{{- $own := .v.placement | default dict }}
{{- $nodeSelector := merge (deepCopy ($own.nodeSelector | default dict)) ($global.nodeSelector | default dict) }}
{{- $affinity := mergeOverwrite (deepCopy ($global.affinity | default dict)) ($own.affinity | default dict) }}
{{- $tolerations := concat ($global.tolerations | default list) ($own.tolerations | default list) | uniq }}
{{- $ownSpread := $own.topologySpreadConstraints | default list }}
{{- $taken := list }}
{{- range $ownSpread }}{{ $taken = append $taken (printf "%s/%s" .topologyKey (.whenUnsatisfiable | default "DoNotSchedule")) }}{{ end }}
{{- $spread := list }}
{{- range $global.topologySpreadConstraints | default list }}
{{- if not (has (printf "%s/%s" .topologyKey (.whenUnsatisfiable | default "DoNotSchedule")) $taken) }}
{{- $spread = append $spread . }}
{{- end }}
{{- end }}
{{- $selector := dict "matchLabels" (include "maas.selectorLabels" (dict "root" .root "component" .component) | fromYaml) }}
{{- $constraints := list }}
{{- range concat $spread $ownSpread }}
{{- $constraint := deepCopy . }}
{{- if not (hasKey $constraint "labelSelector") }}{{ $_ := set $constraint "labelSelector" $selector }}{{ end }}
{{- $constraints = append $constraints $constraint }}
{{- end }}
{{- with $nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $constraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
