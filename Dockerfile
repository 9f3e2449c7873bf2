# Batch ingest gateway. Build: docker build -t ingest-gateway .
#
# One image, two commands:
#   gateway (default):  node dist/src/main.js             HTTP API on $PORT (8080)
#   uploader:           node dist/src/uploader/main.js    needs NATS_URL; /metrics, /healthz,
#                                                         /readyz on $UPLOADER_METRICS_PORT if set
# Gateway, embedded default (one process, files under /app/data):
#   docker run --init -p 8080:8080 -e CLIENTS_FILE=/app/config/clients.json \
#     -v "$PWD/clients.json:/app/config/clients.json:ro" -v ingest-data:/app/data ingest-gateway
# Uploader next to gateways on NATS + S3 (see docker-compose.yml for the whole set):
#   docker run --init -e NATS_URL=nats://nats-1:4222 -e S3_ENDPOINT=http://minio:9000 -e S3_BUCKET=ingest \
#     -e CLIENTS_FILE=/app/config/clients.json -e UPLOADER_METRICS_PORT=9091 -e HEALTHCHECK_PORT=9091 \
#     ingest-gateway node dist/src/uploader/main.js
# Issue a client into a mounted clients file (token printed once):
#   docker run --rm -v "$PWD:/work" ingest-gateway node dist/src/cli/admin.js issue-client \
#     --id acme --ip 203.0.113.0/24 --file /work/clients.json
# Print the effective configuration (secrets masked):
#   docker run --rm -e NATS_URL=... ingest-gateway node dist/src/cli/admin.js print-config
# Without CLIENTS_FILE the embedded default runs with the demo clients (not for production).

# Node 24 (LTS; CI runs the suite on it and on 20). SQLite's driver on it, better-sqlite3 13,
# brings its binary in the package: no compiler needed (the optional better-sqlite3-node20,
# for Node 20 only, may fail to build here and is left out). The uWebSockets.js build this
# service can use has binaries for Node 16/18/20 only, so the image runs the node:http edge
# (HTTP_ENGINE=node, docs/operations.md "Node versions and the HTTP edge").
FROM node:24-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY . .
# Then drop what the runtime never loads: tests, bench, dev dependencies, and the uWS
# binaries, none of which loads on Node 24 (about 90 MB of the 113 MB package).
RUN npm run build \
 && rm -rf dist/test dist/testbed dist/bench dist/.tsbuildinfo \
 && npm prune --omit=dev --no-audit --no-fund \
 && rm -rf node_modules/uWebSockets.js/binaries node_modules/uWebSockets.js/dist/*.node

FROM node:24-bookworm-slim AS runtime
# MALLOC_MMAP_THRESHOLD_: large buffers are mmapped and returned to the kernel when freed, so
# RSS comes back down after a burst (docs/reliability.md, "Hostile input").
ENV NODE_ENV=production HOST=0.0.0.0 HTTP_ENGINE=node MALLOC_MMAP_THRESHOLD_=131072
WORKDIR /app
# App files stay root-owned (read-only to the service); only the data dir is writable.
COPY --from=build /app/package.json ./package.json
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY --from=build /app/config ./config
RUN mkdir -p /app/data && chown node:node /app/data
USER node
EXPOSE 8080
# Liveness of either command: the gateway's port, or HEALTHCHECK_PORT (the uploader's
# UPLOADER_METRICS_PORT). /healthz says the process answers; /readyz is for load balancers.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.HEALTHCHECK_PORT||process.env.PORT||8080)+'/healthz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"]
CMD ["node", "dist/src/main.js"]
