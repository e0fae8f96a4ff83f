{{/* Labels every object carries; `component` is node, gateway or controller where one owns the object. */}}
{{- define "forkd.labels" -}}
app.kubernetes.io/name: forkd
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/part-of: forkd
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/* The labels a workload selects its pods by (never changed by an upgrade: selectors are immutable). */}}
{{- define "forkd.selector" -}}
app.kubernetes.io/name: forkd
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "forkd.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* A ServiceAccount's full user name, as the API server authenticates its tokens. */}}
{{- define "forkd.serviceAccountUser" -}}
system:serviceaccount:{{ .root.Values.namespace }}:forkd-{{ .component }}
{{- end }}

{{/* The security context of the unprivileged components (gateway, controller). */}}
{{- define "forkd.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The downward-API environment every component reads its identity from. */}}
{{- define "forkd.identityEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
