{{- define "so.name" -}}speculator-operator{{- end -}}
{{- define "so.serviceAccount" -}}{{ default (include "so.name" .) .Values.serviceAccount.name }}{{- end -}}
{{- define "so.labels" -}}
app.kubernetes.io/name: {{ include "so.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
