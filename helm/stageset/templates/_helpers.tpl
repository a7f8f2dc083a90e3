{{/*
Names. Every object a release creates derives its name from the release, so any number of
releases (in one namespace or several) coexist.
  stageset.fullname      namespaced objects: "<release>-stageset", or the release name when it
                         already contains "stageset" (no "stageset-stageset"); fullnameOverride wins.
  stageset.clusterName   cluster-scoped objects (ClusterRole, ClusterRoleBindings): the fullname
                         prefixed with the release namespace, since release names are unique per
                         namespace only.
*/}}
{{- define "stageset.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "stageset.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "stageset.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "stageset.fullname" .) -}}
{{- end -}}

{{- define "stageset.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "stageset.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stageset.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "stageset.labels" -}}
helm.sh/chart: {{ include "stageset.chart" . }}
{{ include "stageset.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: stageset
{{- end -}}

{{- define "stageset.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The mode, as NOTES.txt and the docs name it. */}}
{{- define "stageset.mode" -}}
{{- if .Values.rbac.clusterAdmin -}}single-tenant (rbac.clusterAdmin=true: the controller is bound to cluster-admin)
{{- else -}}multi-tenant (rbac.clusterAdmin=false: every StageSet applies as its own ServiceAccount)
{{- end -}}
{{- end -}}

{{/* A Go duration ("1m30s", "500ms") in seconds, as a float; the schema has checked its form. */}}
{{- define "stageset.seconds" -}}
{{- $total := 0.0 -}}
{{- range (regexFindAll "[0-9.]+(ms|s|m|h)" . -1) -}}
{{- $factor := get (dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0) (regexReplaceAll "^[0-9.]+" . "") -}}
{{- $total = addf $total (mulf (regexFind "^[0-9.]+" . | float64) $factor) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* A controller.build key as --build-limit names it: maxStageObjects -> max_stage_objects,
kustomizeMemory -> kustomize_memory_bytes. */}}
{{- define "stageset.buildLimitName" -}}
{{- $name := snakecase . -}}
{{- if eq $name "kustomize_memory" -}}kustomize_memory_bytes
{{- else -}}{{ $name }}
{{- end -}}
{{- end -}}
