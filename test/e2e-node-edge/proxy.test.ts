// The end-to-end suite, run unchanged on the node:http edge.
process.env.TEST_HTTP_ENGINE = 'node';
await import('../e2e/proxy.test.js');
