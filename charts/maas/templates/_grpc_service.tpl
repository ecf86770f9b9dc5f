{{/*
A `maas serve <component>` gRPC service: Deployment + Service.
Params: root, component, v (its values), env (extra env entries, YAML),
config (optional: a ConfigMap component name, mounted at /etc/maas/<config>),
apiAccess (optional: mount the ServiceAccount token, for a component that calls the API server).
Its values may add volumes and volumeMounts (the tokenizer's model folders).
*/}}
{{- define "maas.grpcService" -}}
{{- $ctx := dict "root" .root "component" .component }}
{{- $root := .root }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "maas.name" $ctx }}
  labels:
    {{- include "maas.labels" $ctx | nindent 4 }}
spec:
  replicas: {{ .v.replicas }}
  selector:
    matchLabels:
      {{- include "maas.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "maas.labels" $ctx | nindent 8 }}
      {{- if .config }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/configmaps.yaml") $root | sha256sum }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "maas.name" $ctx }}
      automountServiceAccountToken: {{ .apiAccess | default false }}
      {{- include "maas.podSpecCommon" $root | nindent 6 }}
      {{- with include "maas.placement" (dict "root" $root "component" .component "v" .v) | trim }}{{ . | nindent 6 }}{{ end }}
      containers:
        - name: {{ .component }}
          image: {{ include "maas.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args: [{{ .component }}]
          env:
            {{- include "maas.commonEnv" $root | nindent 12 }}
            - name: MAAS_PORT
              value: {{ .v.grpcPort | quote }}
            - name: MAAS_METRICS_PORT
              value: {{ .v.metricsPort | quote }}
            {{- with .env }}
            {{- . | nindent 12 }}
            {{- end }}
          ports:
            - {name: grpc, containerPort: {{ .v.grpcPort }}}
            - {name: metrics, containerPort: {{ .v.metricsPort }}}
          {{- include "maas.grpcProbes" (dict "port" .v.grpcPort "liveness" .liveness) | nindent 10 }}
          resources:
            {{- toYaml .v.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "maas.tmpMount" $root | nindent 12 }}
            {{- with .v.volumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- with .config }}
            - name: {{ . }}
              mountPath: /etc/maas/{{ . }}
              readOnly: true
            {{- end }}
      volumes:
        {{- include "maas.tmpVolume" $root | nindent 8 }}
        {{- with .v.volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- with .config }}
        - name: {{ . }}
          configMap:
            name: {{ include "maas.name" (dict "root" $root "component" .) }}
        {{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "maas.name" $ctx }}
  labels:
    {{- include "maas.labels" $ctx | nindent 4 }}
spec:
  selector:
    {{- include "maas.selectorLabels" $ctx | nindent 4 }}
  ports:
    - {name: grpc, port: {{ .v.grpcPort }}, targetPort: grpc}
    - {name: metrics, port: {{ .v.metricsPort }}, targetPort: metrics}
{{- end -}}
