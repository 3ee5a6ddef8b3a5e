# shellcheck shell=bash
# The TLS pieces of the benchmark configurations (sourced, not run): a throw-away CA with one
# leaf certificate for 127.0.0.1 and localhost, and the fencegate tables and nginx servers that
# use them, so that fencegate and nginx serve and verify the same certificates.

# The name both proxies verify in the upstream's certificate and send as SNI.
TLS_SERVER_NAME=localhost

# tls_certs DIR: in DIR, ca.crt (the CA both proxies trust), server.crt + server.key (its leaf,
# for 127.0.0.1 and localhost, served by the listeners and the TLS upstream alike) and
# wrong-ca.crt (a CA that signed nothing here, for the verification-failure check). EC P-256.
tls_certs() {
  local dir=$1
  mkdir -p "$dir"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=fencegate bench CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=fencegate bench wrong CA" -keyout "$dir/wrong-ca.key" -out "$dir/wrong-ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=$TLS_SERVER_NAME" -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:%s,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' "$TLS_SERVER_NAME" >"$dir/san.ext"
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 2 -extfile "$dir/san.ext" -out "$dir/server.crt" 2>/dev/null
}

# tls_upstream_table CA_FILE: fencegate's [routes.upstream_tls], trusting only CA_FILE.
tls_upstream_table() {
  printf '[routes.upstream_tls]\nca_file = "%s"\nserver_name = "%s"\n' "$1" "$TLS_SERVER_NAME"
}

# tls_gateway_toml DIR STATE_DIR PORT LISTENER UPSTREAM: a gateway whose only route is the
# passthrough /plain/{id} (mode = "off") to the URL UPSTREAM, trusting DIR's CA when it is
# https://; its listener on PORT is plain or, with LISTENER = tls, serves DIR's leaf certificate.
tls_gateway_toml() {
  local dir=$1 state=$2 port=$3 listener=$4 upstream=$5
  printf '[server]\nlisten = "127.0.0.1:%s"\nstate_dir = "%s"\n' "$port" "$state"
  if [ "$listener" = tls ]; then
    printf '[server.tls]\ncert = "%s/server.crt"\nkey = "%s/server.key"\n' "$dir" "$dir"
  fi
  printf '[store]\nbackend = "embedded"\npath = "%s/fencegate.db"\n' "$state"
  printf '[[routes]]\nname = "plain"\npath = "/plain/{id}"\nupstream = "%s"\n' "$upstream"
  case $upstream in https://*) tls_upstream_table "$dir/ca.crt" ;; esac
  printf '[routes.fence]\nmode = "off"\n'
}

# tls_wrong_ca_route DIR UPSTREAM: the route /wrong-ca/{id} to the https:// URL UPSTREAM,
# trusting DIR's wrong-ca.crt, which did not sign the upstream's certificate.
tls_wrong_ca_route() {
  printf '[[routes]]\nname = "wrong-ca"\npath = "/wrong-ca/{id}"\nupstream = "%s"\n' "$2"
  tls_upstream_table "$1/wrong-ca.crt"
  printf '[routes.fence]\nmode = "off"\n'
}

# The protocols nginx may speak, fencegate's (rustls: 1.2 and 1.3). nginx 1.22, Debian 12's,
# leaves TLS 1.3 out of both defaults and would measure TLS 1.2 against fencegate's 1.3.
TLS_NGINX_PROTOCOLS="TLSv1.2 TLSv1.3"

# tls_nginx_listen DIR ADDRESS: an nginx server's `listen ... ssl` with DIR's leaf certificate.
tls_nginx_listen() {
  printf 'listen %s ssl;\n    ssl_protocols %s;\n' "$2" "$TLS_NGINX_PROTOCOLS"
  printf '    ssl_certificate %s/server.crt;\n    ssl_certificate_key %s/server.key;\n' "$1" "$1"
}

# tls_nginx_upstream_server DIR PORT: the upstream's `return 200` again, with TLS on PORT
# (HTTP/1.1 only, as the plain one: no h2 by ALPN for fencegate to pick).
tls_nginx_upstream_server() {
  cat <<NGINX
  server {
    $(tls_nginx_listen "$1" "127.0.0.1:$2")
    location / { return 200 "ok"; }
  }
NGINX
}

# tls_nginx_proxy_servers DIR UPSTREAM_PORT LISTENER_PORT PLAIN_PORT: the reference proxy's TLS
# servers: on LISTENER_PORT, TLS in front of the plain upstream `origin` (the caller's); on
# PLAIN_PORT, plain in front of the TLS upstream on UPSTREAM_PORT, kept alive as `origin` is and
# verified as fencegate verifies it (DIR's CA only, the same name, sent as SNI), TLS sessions reused.
tls_nginx_proxy_servers() {
  cat <<NGINX
  upstream origin_tls {
    server 127.0.0.1:$2;
    keepalive 256;
  }
  server {
    $(tls_nginx_listen "$1" "127.0.0.1:$3")
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
  server {
    listen 127.0.0.1:$4;
    location / {
      proxy_pass https://origin_tls;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_ssl_protocols $TLS_NGINX_PROTOCOLS;
      proxy_ssl_trusted_certificate $1/ca.crt;
      proxy_ssl_verify on;
      proxy_ssl_name $TLS_SERVER_NAME;
      proxy_ssl_server_name on;
      proxy_ssl_session_reuse on;
    }
  }
NGINX
}
