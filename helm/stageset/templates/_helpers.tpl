{{- define "stageset.name" -}}{{ .Release.Name }}-stageset{{- end -}}
{{- define "stageset.fullname" -}}{{ include "stageset.name" . }}{{- end -}}
{{- define "stageset.labels" -}}
app.kubernetes.io/name: stageset
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
