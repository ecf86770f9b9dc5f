{{/* NetworkPolicy peers: a component of this release, or the metrics scraper. */}}
{{- define "maas.peer" -}}
- podSelector:
    matchLabels:
      {{- include "maas.selectorLabels" . | nindent 6 }}
{{- end }}
{{- define "maas.metricsPeer" -}}
- namespaceSelector:
    matchLabels:
      {{- toYaml .Values.networkPolicy.metricsNamespaceSelector | nindent 6 }}
{{- end }}
