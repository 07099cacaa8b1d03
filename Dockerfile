# syntax=docker/dockerfile:1
# joblib: a static binary on a distroless base, run as a non-root user.
#   docker build -t joblib --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse --short HEAD) .
# deploy/compose.yaml runs PostgreSQL and two nodes from this image.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=""
ARG COMMIT=""
# The build the test command (deploy/deploy_test.go) runs too, word for word.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o /out/joblib ./cmd/joblib

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/joblib /usr/local/bin/joblib
# nonroot (65532) owns /data: the default SQLite database lives there when no
# PostgreSQL URL is given.
WORKDIR /data
ENV JOBLIB_LISTEN_ADDR=:8080 \
    JOBLIB_LOG_FORMAT=json \
    JOBLIB_DATABASE_URL=/data/joblib.db
USER 65532:65532
EXPOSE 8080
VOLUME ["/data"]
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 CMD ["/usr/local/bin/joblib", "health"]
ENTRYPOINT ["/usr/local/bin/joblib"]
CMD ["serve"]
