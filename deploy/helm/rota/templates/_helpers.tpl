{{/* Names and labels shared by every object of the chart. */}}
{{- define "rota.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rota.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "rota.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "rota.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "rota.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rota.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rota.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "rota.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Secret holding the tokens: the user's, or the one the chart makes. */}}
{{- define "rota.tokenSecret" -}}
{{- default (printf "%s-tokens" (include "rota.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* Refuses values rota would refuse at start, with what to set instead. */}}
{{- define "rota.validate" -}}
{{- if and (not .Values.auth.tokens) (not .Values.insecure) }}
{{- fail "rota listens on 0.0.0.0 in the pod and refuses to start without tokens: set auth.tokens (with auth.existingSecret or a value per token), or insecure=true for a trusted network" }}
{{- end }}
{{- if and .Values.auth.tokens .Values.insecure }}
{{- fail "auth.tokens and insecure=true together: insecure only matters without tokens; drop one" }}
{{- end }}
{{- range .Values.auth.tokens }}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._-]*$" (toString .name)) }}
{{- fail (printf "auth.tokens: name %q must be letters, digits, '.', '_' or '-' (it names the token's file and Secret key)" (toString .name)) }}
{{- end }}
{{- if not .scopes }}
{{- fail (printf "auth.tokens: token %q has no scopes" .name) }}
{{- end }}
{{- if and (not $.Values.auth.existingSecret) (lt (len (toString (default "" .value))) 16) }}
{{- fail (printf "auth.tokens: token %q needs a value of at least 16 characters, or set auth.existingSecret" .name) }}
{{- end }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.state.url) (not .Values.state.existingSecret) }}
{{- fail "replicaCount > 1 needs a shared state (state.url or state.existingSecret): with the memory state every replica keeps its own tickets and instance table" }}
{{- end }}
{{- if and .Values.state.url .Values.state.existingSecret }}
{{- fail "state.url and state.existingSecret together: set one" }}
{{- end }}
{{- if and .Values.tls.clientCASecret (not .Values.tls.secretName) }}
{{- fail "tls.clientCASecret needs tls.secretName: mTLS runs over the server's TLS" }}
{{- end }}
{{- end }}

{{/* One [server] setting as a TOML line: strings quoted, numbers and booleans as they are
(YAML numbers arrive as floats: whole ones are written as integers, 268435456 not 2.68e+08). */}}
{{- define "rota.tomlValue" -}}
{{- if kindIs "string" . }}{{ . | quote }}
{{- else if kindIs "bool" . }}{{ . }}
{{- else if and (kindIs "float64" .) (eq . (float64 (int64 .))) }}{{ int64 . }}
{{- else if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}{{ . }}
{{- else }}{{ fail (printf "server settings are strings, numbers or booleans, not %s" (kindOf .)) }}
{{- end }}
{{- end }}
