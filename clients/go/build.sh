#!/usr/bin/env bash
# Build the Go programs, offline, with Debian's packages:
#   apt-get install golang-go golang-google-grpc-dev golang-google-protobuf-dev \
#                   protoc-gen-go protoc-gen-go-grpc protobuf-compiler
#
#   clients/go/build.sh [example] [loadgen]     (default: both; `make clients-go`, `make loadgen`)
#
# example: go_example, with Go stubs generated from protos/. loadgen: the bench's open-loop
# load generator (loadgen/main.go; it sends pre-serialized bytes, so it needs no stubs).
# Debian's Go libraries live in /usr/share/gocode (GOPATH layout), so this builds in GOPATH
# mode; nothing is fetched. Everything goes to clients/go/build/ (never committed).
set -euo pipefail
cd "$(dirname "$0")"
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(example loadgen)
PROTOS=../../protos
OUT=build
PKG=trtserve.local
export GOPATH="$PWD/$OUT:/usr/share/gocode" GO111MODULE=off GOFLAGS= GOCACHE="${GOCACHE:-$PWD/$OUT/cache}"
for target in "${TARGETS[@]}"; do
  case $target in
    example)
      rm -rf "$OUT/src/$PKG/inference" "$OUT/src/$PKG/example"
      mkdir -p "$OUT/src/$PKG/example"
      # The protos carry no go_package option (they are Triton's, unchanged): map them with M flags.
      M="Minference/grpc_service.proto=$PKG/inference,Minference/model_config.proto=$PKG/inference"
      protoc -I "$PROTOS" \
        --go_out="$OUT/src/$PKG" --go_opt="paths=source_relative,$M" \
        --go-grpc_out="$OUT/src/$PKG" --go-grpc_opt="paths=source_relative,$M" \
        inference/grpc_service.proto inference/model_config.proto
      cp main.go "$OUT/src/$PKG/example/"
      go build -o "$OUT/go_example" "$PKG/example"
      echo "built clients/go/$OUT/go_example" ;;
    loadgen)
      rm -rf "$OUT/src/$PKG/loadgen"
      mkdir -p "$OUT/src/$PKG/loadgen"
      cp loadgen/main.go "$OUT/src/$PKG/loadgen/"
      go build -o "$OUT/loadgen" "$PKG/loadgen"
      echo "built clients/go/$OUT/loadgen" ;;
    *) echo "unknown Go target '$target' (example, loadgen)" >&2; exit 2 ;;
  esac
done
