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

{{/* The pod selector of one controller Deployment (an item of stageset.instances, with "root"):
the main one's is selectorLabels (immutable, as it always was); a shard's pods are named
<name>-shard, so the main selector never matches them, and carry their key.  Disjoint selectors:
each Deployment, metrics Service and PodDisruptionBudget selects its own pods only. */}}
{{- define "stageset.podSelector" -}}
{{- $selector := include "stageset.selectorLabels" .root | fromYaml -}}
{{- if .key -}}
{{- $_ := set $selector "app.kubernetes.io/name" (printf "%s-shard" (include "stageset.name" .root)) -}}
{{- $_ := set $selector "stages.metio.wtf/shard" .key -}}
{{- end -}}
{{- toYaml $selector -}}
{{- end -}}

{{/* Every object's labels: commonLabels first, so the chart's own always win. */}}
{{- define "stageset.labels" -}}
{{ with omit .Values.commonLabels "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "app.kubernetes.io/component" "app.kubernetes.io/part-of" }}{{ toYaml . }}
{{ end -}}
helm.sh/chart: {{ include "stageset.chart" . }}
{{ include "stageset.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: stageset
{{- end -}}

{{/* commonAnnotations as metadata lines at indent 2, starting with a newline (nothing when empty). */}}
{{- define "stageset.annotations" -}}
{{- with .Values.commonAnnotations }}
  annotations: {{- toYaml . | nindent 4 }}
{{- end }}
{{- end -}}

{{/* The controller's ServiceAccount: the chart's (named after the release) or serviceAccount.name. */}}
{{- define "stageset.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "stageset.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.create=false needs serviceAccount.name (an existing ServiceAccount in the release namespace)" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* image.repository, its registry (the first part, when it names a host: a dot, a port or
localhost) replaced by image.registry when that is set. */}}
{{- define "stageset.imageRepository" -}}
{{- $repository := .Values.image.repository -}}
{{- if .Values.image.registry -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = join "/" (rest $parts) -}}
{{- end -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .Values.image.registry) $repository -}}
{{- end -}}
{{- $repository -}}
{{- end -}}

{{- define "stageset.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- $repository := include "stageset.imageRepository" . -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
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

{{/* A Kubernetes quantity ("512Mi", "2G", "1.5Gi", 1000) in bytes, as an integer; the schema has
checked its form. */}}
{{- define "stageset.bytes" -}}
{{- $text := toString . -}}
{{- $number := regexFind "^[0-9.]+" $text | float64 -}}
{{- $suffix := regexReplaceAll "^[0-9.]+" $text "" -}}
{{- $factor := get (dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0) $suffix -}}
{{- mulf $number $factor | ceil | int64 -}}
{{- end -}}

{{/* Bytes as a whole number of MiB, rounded up, in the apiserver's canonical form ("2304Mi", "4Gi"):
the form it stores, so server-side apply and GitOps diffs never see "4096Mi" against "4Gi". */}}
{{- define "stageset.mebibytes" -}}
{{- $mib := divf (int64 .) 1048576.0 | ceil | int64 -}}
{{- if and (gt $mib 0) (eq (mod $mib 1048576) 0) -}}{{ printf "%dTi" (div $mib 1048576) }}
{{- else if and (gt $mib 0) (eq (mod $mib 1024) 0) -}}{{ printf "%dGi" (div $mib 1024) }}
{{- else -}}{{ printf "%dMi" $mib }}
{{- end -}}
{{- end -}}

{{/*
Memory the pod's container may need at most, from the flags (docs/sizing.md): the controller
process, plus one kustomize builder per StageSet worker (the controller runs at most --workers
builds at once, each under RLIMIT_DATA = its heap limit + the Go runtime's own), plus the CEL
workers (each under RLIMIT_DATA).  The constants are the code's; tests/helm/test_sizing.py keeps
them equal.
*/}}
{{- define "stageset.memoryNeeded" -}}
{{- $mi := 1048576 -}}
{{- $heap := include "stageset.bytes" (.Values.controller.build.kustomizeMemory | default "256Mi") | int64 -}}
{{- $builder := add $heap (mul 128 $mi) -}}
{{- $cel := mul 2 (mul 256 $mi) -}}
{{- $controller := mul 256 $mi -}}
{{- add $controller (mul .Values.controller.workers $builder) $cel (include "stageset.driftWatchMemory" . | int64) -}}
{{- end -}}

{{/* What drift watches above the 500 the controller's 256Mi reserve covers need: 160Ki each (a thread
and a TLS connection; measured about 145 KiB, docs/sizing.md#drift-watches). */}}
{{- define "stageset.driftWatchMemory" -}}
{{- $watches := int64 (.Values.controller.maxDriftWatches | default 0) -}}
{{- if gt $watches 500 -}}{{- mul (sub $watches 500) 163840 -}}{{- else -}}0{{- end -}}
{{- end -}}

{{/* The controller Deployments of the release, as a JSON list of {suffix, key, selector, shardKeys}:
one without controller.shards; with it (Flux's sharding convention, docs/install.md#sharding-by-label)
the main one, watching every object without a sharding.fluxcd.io/key (and told the shards' keys, so
it reports objects whose key names none of them), and one per key. controller.watchLabelSelector,
when set, is part of every one of them. */}}
{{- define "stageset.instances" -}}
{{- $base := .Values.controller.watchLabelSelector | default "" -}}
{{- $shards := .Values.controller.shards | default list -}}
{{- $out := list -}}
{{- if $shards -}}
{{- $out = append $out (dict "suffix" "" "key" "" "selector" (join "," (compact (list $base "!sharding.fluxcd.io/key"))) "shardKeys" (join "," $shards)) -}}
{{- range $shards -}}
{{- $out = append $out (dict "suffix" (printf "-%s" .) "key" . "selector" (join "," (compact (list $base (printf "sharding.fluxcd.io/key=%s" .)))) "shardKeys" "") -}}
{{- end -}}
{{- else -}}
{{- $out = append $out (dict "suffix" "" "key" "" "selector" $base "shardKeys" "") -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The pod template of a hook Job (the CRDs before install/upgrade, the cleanup before uninstall):
the controller's image, security context and placement, run as the hook's own ServiceAccount.
Called with (dict "root" $ "account" NAME "component" NAME "command" LIST). */}}
{{- define "stageset.hookPod" -}}
{{- $root := .root -}}
{{- /* Without app.kubernetes.io/name: the controller Deployment's selector (name and instance) and
the metrics Service must never select a hook's pod. */ -}}
{{- $labels := omit (include "stageset.labels" $root | fromYaml) "app.kubernetes.io/name" -}}
{{- $_ := set $labels "app.kubernetes.io/component" .component -}}
metadata:
  labels: {{- toYaml $labels | nindent 4 }}
spec:
  serviceAccountName: {{ .account }}
  restartPolicy: Never
  enableServiceLinks: false
  {{- with $root.Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.podSecurityContext }}
  securityContext: {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .component }}
      image: {{ include "stageset.image" $root | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command: {{- toYaml .command | nindent 8 }}
      {{- with $root.Values.securityContext }}
      securityContext: {{- toYaml . | nindent 8 }}
      {{- end }}
      resources:
        requests: {cpu: 10m, memory: 64Mi}
        limits: {memory: 256Mi}
  {{- with $root.Values.nodeSelector }}
  nodeSelector: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.tolerations }}
  tolerations: {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
