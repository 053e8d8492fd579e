{{/* Names and labels shared by every object of the chart. */}}
{{- define "nereid.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nereid.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nereid.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nereid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nereid.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "nereid.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "nereid.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{/* The model repository argument: the PVC mount (with its sub-path) or the S3 URL. */}}
{{- define "nereid.repositoryArg" -}}
{{- $repo := .Values.modelRepository -}}
{{- if eq $repo.source "s3" -}}
{{- required "modelRepository.s3.url is required when modelRepository.source is s3" $repo.s3.url -}}
{{- else if eq $repo.source "pvc" -}}
{{- if $repo.pvc.subPath -}}{{ printf "%s/%s" $repo.pvc.mountPath $repo.pvc.subPath }}{{- else -}}{{ $repo.pvc.mountPath }}{{- end -}}
{{- else -}}
{{- fail "modelRepository.source must be pvc or s3" -}}
{{- end -}}
{{- end -}}

{{- define "nereid.claimName" -}}
{{- if .Values.modelRepository.pvc.claimName -}}
{{- .Values.modelRepository.pvc.claimName -}}
{{- else if .Values.modelRepository.pvc.create -}}
{{- printf "%s-models" (include "nereid.fullname" .) -}}
{{- else -}}
{{- fail "modelRepository.pvc.claimName is required (or set modelRepository.pvc.create)" -}}
{{- end -}}
{{- end -}}

{{/* Kubernetes must not kill a pod before its drain ends: pre-stop sleep + --exit-timeout-secs + a margin. */}}
{{- define "nereid.terminationGrace" -}}
{{- add (int .Values.server.preStopSleepSeconds) (int (ceil .Values.server.exitTimeoutSecs)) (int .Values.server.terminationGraceMarginSeconds) -}}
{{- end -}}
