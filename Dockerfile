# Batch ingest gateway. Build: docker build -t ingest-gateway .
#
# Gateway (default command):
#   docker run --init -p 8080:8080 -e CLIENTS_FILE=/app/config/clients.json \
#     -v "$PWD/clients.json:/app/config/clients.json:ro" -v ingest-data:/app/data ingest-gateway
# Issue a client into a mounted clients file (token printed once):
#   docker run --rm -v "$PWD:/work" ingest-gateway node dist/src/cli/admin.js issue-client \
#     --id acme --ip 203.0.113.0/24 --file /work/clients.json
# Without CLIENTS_FILE the embedded default runs with the demo clients (not for production).

FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY . .
RUN npm run build \
 && rm -rf dist/test dist/bench dist/.tsbuildinfo \
 && npm prune --omit=dev --no-audit --no-fund

FROM node:20-bookworm-slim AS runtime
ENV NODE_ENV=production HOST=0.0.0.0
WORKDIR /app
# App files stay root-owned (read-only to the service); only the data dir is writable.
COPY --from=build /app/package.json ./package.json
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY --from=build /app/config ./config
RUN mkdir -p /app/data && chown node:node /app/data
USER node
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.PORT||8080)+'/openapi.json').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"]
CMD ["node", "dist/src/main.js"]
