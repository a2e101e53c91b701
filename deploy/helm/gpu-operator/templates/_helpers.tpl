{{/*
Names and labels shared by every template.
*/}}
{{- define "gpu-operator.name" -}}
{{- .Chart.Name -}}
{{- end -}}

{{- define "gpu-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object this chart installs. */}}
{{- define "gpu-operator.labels" -}}
app.kubernetes.io/name: {{ include "gpu-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "gpu-operator.chart" . }}
{{- end -}}

{{/* The operator pod's selector: stable across upgrades (a Deployment's selector is immutable). */}}
{{- define "gpu-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The operator image, `operator.version` defaulting to the chart's appVersion. */}}
{{- define "gpu-operator.image" -}}
{{- printf "%s/%s:%s" .Values.operator.repository .Values.operator.image (.Values.operator.version | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The validator image the operator falls back to (VALIDATOR_IMAGE), as the ClusterPolicy names it. */}}
{{- define "gpu-operator.validatorImage" -}}
{{- printf "%s/%s:%s" .Values.validator.repository .Values.validator.image (.Values.validator.version | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "gpu-operator.driverManagerImage" -}}
{{- with .Values.driver.manager -}}
{{- printf "%s/%s:%s" .repository .image .version -}}
{{- end -}}
{{- end -}}

{{/*
The fields every operand section of a ClusterPolicy shares (image triple, pull settings, resources, env,
args, hostNetwork), each written only when set, as NVIDIA's chart writes them: a values file written for
that chart gives the same spec. Takes the operand's values.
*/}}
{{- define "gpu-operator.operandFields" -}}
{{- with .repository }}
repository: {{ . }}
{{- end }}
{{- with .image }}
image: {{ . }}
{{- end }}
{{- with .version }}
version: {{ . | quote }}
{{- end }}
{{- with .imagePullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- with .imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .resources }}
resources: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .env }}
env: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .args }}
args: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .hostNetwork }}
hostNetwork: {{ . }}
{{- end }}
{{- end -}}

{{/* A driver manager block (`driver.manager`, `vgpuManager.driverManager`, `vfioManager.driverManager`). */}}
{{- define "gpu-operator.driverManagerFields" -}}
{{- with .repository }}
repository: {{ . }}
{{- end }}
{{- with .image }}
image: {{ . }}
{{- end }}
{{- with .version }}
version: {{ . | quote }}
{{- end }}
{{- with .imagePullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- with .env }}
env: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The hook Jobs' shared pod settings: the operator image, its pull secrets and placement, locked down. */}}
{{- define "gpu-operator.hookPod" -}}
restartPolicy: Never
{{- with .Values.operator.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- with .Values.operator.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.operator.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.operator.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "gpu-operator.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}
