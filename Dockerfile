# idemkv: the static binary in an otherwise empty image.
#
# The binary is built outside the image, as release pipelines do, and the build context
# holds just the binary and an empty data/ directory:
#
#   CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$VERSION" -o dist/idemkv ./cmd/idemkv
#   mkdir -p dist/data && cp Dockerfile dist/
#   docker build -t idemkv:$VERSION dist/
#
# The server listens on every interface inside the container, so it refuses to start
# without --auth-file and --peer-* (see docs/operations.md), unless told
# --insecure-listen.
FROM scratch
COPY idemkv /idemkv
# The data volume belongs to the unprivileged user the server runs as; a named volume
# mounted here inherits that owner.
COPY --chown=65532:65532 data /data
USER 65532:65532
VOLUME ["/data"]
EXPOSE 7420 7421
ENV IDEMKV_DATA_DIR=/data \
    IDEMKV_HTTP_ADDR=0.0.0.0:7420 \
    IDEMKV_RAFT_ADDR=0.0.0.0:7421
ENTRYPOINT ["/idemkv"]
CMD ["serve"]
