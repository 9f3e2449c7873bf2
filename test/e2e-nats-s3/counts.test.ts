// The end-to-end suite of the embedded default, run unchanged on NATS JetStream + S3.
process.env.TEST_BACKEND = 'nats-s3';
await import('../e2e/counts.test.js');
