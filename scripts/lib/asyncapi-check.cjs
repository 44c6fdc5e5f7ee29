// Validates an AsyncAPI document with the AsyncAPI parser (npm @asyncapi/parser, found
// through NODE_PATH): prints every diagnostic, exits 1 on an error.
const { Parser } = require('@asyncapi/parser');
const { readFileSync } = require('fs');

const SEVERITY = ['error', 'warning', 'info', 'hint'];

async function main(path) {
  const { document, diagnostics } = await new Parser().parse(readFileSync(path, 'utf8'));
  for (const d of diagnostics) {
    console.log(`${SEVERITY[d.severity]} ${d.code} ${d.path.join('.')}: ${d.message}`);
  }
  if (!document || diagnostics.some((d) => d.severity === 0)) {
    console.log(`${path}: not a valid AsyncAPI document`);
    process.exit(1);
  }
  const components = document.components();
  console.log(
    `${path}: valid AsyncAPI ${document.version()}, ${document.channels().length} channels, ` +
      `${document.operations().length} operations, ${components.messages().length} messages`,
  );
}

main(process.argv[2]).catch((e) => {
  console.log(`${process.argv[2]}: ${e.message}`);
  process.exit(1);
});
