{{/*
NetworkPolicy peers: a component of this release, or the metrics scraper.
With "namespace", the component is matched in the release's namespace from
a policy in another one (a bare podSelector only sees its own namespace).
*/}}
{{- define "maas.peer" -}}
- podSelector:
    matchLabels:
      {{- include "maas.selectorLabels" . | nindent 6 }}
  {{- with .namespace }}
  namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ . }}
  {{- end }}
{{- end }}
{{- define "maas.metricsPeer" -}}
- namespaceSelector:
    matchLabels:
      {{- toYaml .Values.networkPolicy.metricsNamespaceSelector | nindent 6 }}
{{- end }}
