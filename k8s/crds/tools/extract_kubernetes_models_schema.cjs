// Loads a @kubernetes-models (plain-schema generation) model file with stubbed dependencies and
// prints the JSON schema it registers.
const fs = require('fs'); const vm = require('vm');
const file = process.argv[2];
let captured = null;
const stubs = {
  '@kubernetes-models/validate': { register: (id, s) => { captured = s; } },
  '@kubernetes-models/base': { Model: class {}, createTypeMetaGuard: () => () => true,
                                setSchema: (cls, id, fn) => fn() },
};
const req = (name) => stubs[name] || { addSchema: () => {} };
const exp = {};
vm.runInNewContext(fs.readFileSync(file, 'utf8'), { require: req, exports: exp, module: { exports: exp } });
process.stdout.write(JSON.stringify(captured, null, 2) + '\n');
