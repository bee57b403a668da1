#!/usr/bin/env bash
# Generate the Go stubs from protos/ and build go_example, offline, with Debian's packages:
#   apt-get install golang-go golang-google-grpc-dev golang-google-protobuf-dev \
#                   protoc-gen-go protoc-gen-go-grpc protobuf-compiler
# Debian's Go libraries live in /usr/share/gocode (GOPATH layout), so this builds in GOPATH
# mode; nothing is fetched. Everything goes to clients/go/build/ (never committed).
set -euo pipefail
cd "$(dirname "$0")"
PROTOS=../../protos
OUT=build
PKG=trtserve.local
rm -rf "$OUT/src"
mkdir -p "$OUT/src/$PKG/example"
# The protos carry no go_package option (they are Triton's, unchanged): map them with M flags.
M="Minference/grpc_service.proto=$PKG/inference,Minference/model_config.proto=$PKG/inference"
protoc -I "$PROTOS" \
  --go_out="$OUT/src/$PKG" --go_opt="paths=source_relative,$M" \
  --go-grpc_out="$OUT/src/$PKG" --go-grpc_opt="paths=source_relative,$M" \
  inference/grpc_service.proto inference/model_config.proto
cp main.go "$OUT/src/$PKG/example/"
GOPATH="$PWD/$OUT:/usr/share/gocode" GO111MODULE=off GOFLAGS= GOCACHE="${GOCACHE:-$PWD/$OUT/cache}" \
  go build -o "$OUT/go_example" "$PKG/example"
echo "built clients/go/$OUT/go_example"
