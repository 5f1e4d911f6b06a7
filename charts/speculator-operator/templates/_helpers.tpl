{{- /* The chart's name (nameOverride replaces it): the app.kubernetes.io/name label. */}}
{{- define "so.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- /* Every object's name: fullnameOverride, else the release name where it already holds the chart's name,
else RELEASE-NAME. Two releases get two names, so they never share a Deployment, a Lease or a Role. */}}
{{- define "so.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end -}}

{{- /* The Service of the operator's own metrics: FULLNAME-metrics, within a Service name's 63 characters. */}}
{{- define "so.metricsService" -}}
{{- printf "%s-metrics" (include "so.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end -}}

{{- /* The Lease the replicas elect their leader with: the fullname, so two releases never share one. */}}
{{- define "so.leaseName" -}}
{{- include "so.fullname" . }}
{{- end -}}

{{- define "so.serviceAccount" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "so.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: the existing ServiceAccount to run as (serviceAccount.create is false)" .Values.serviceAccount.name }}
{{- end }}
{{- end -}}

{{- define "so.selectorLabels" -}}
app.kubernetes.io/name: {{ include "so.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "so.labels" -}}
{{ include "so.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- /* The operator's image: REPOSITORY:TAG, or REPOSITORY:TAG@DIGEST where a digest pins the build. */}}
{{- define "so.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end -}}

{{- /* imagePullSecrets' names, comma-separated: what the operator gives every pod it renders. */}}
{{- define "so.pullSecretNames" -}}
{{- $names := list }}
{{- range .Values.imagePullSecrets }}{{ $names = append $names .name }}{{ end }}
{{- join "," $names }}
{{- end -}}
